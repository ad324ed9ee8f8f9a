"""distlab's collectives on real gloo processes, checked against torch.distributed's built-ins.

Each world size is one launch; inside it every rank runs a grid of
(algorithm, element count, dtype, op) cases and compares its result with
the built-in collective on the same input (and with a float64 reference
for low-precision dtypes, whose rounding depends on the summation order).
"""

import pytest
import torch

import distlab

WORLD_SIZES = [1, 2, 3, 4, 5, 6, 7, 8]


def _grid_worker(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.collectives import hierarchical_all_reduce
    from distlab.sim.algorithms import ALL_REDUCE

    algorithms = dict(ALL_REDUCE)
    algorithms["hierarchical_2"] = lambda t, op: hierarchical_all_reduce(t, op, ranks_per_node=2)
    if world_size % 2 == 0:
        algorithms["hierarchical_shard_2"] = lambda t, op: hierarchical_all_reduce(
            t, op, ranks_per_node=2, variant="shard"
        )
    cases = [
        (torch.float32, "sum"),
        (torch.float32, "avg"),
        (torch.float32, "max"),
        (torch.float32, "min"),
        (torch.float64, "sum"),
        (torch.bfloat16, "sum"),
        (torch.int64, "sum"),
        (torch.int64, "max"),
        (torch.int64, "product"),
    ]
    builtin_op = {
        "sum": dist.ReduceOp.SUM,
        "avg": dist.ReduceOp.SUM,
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT,
    }
    failures = []
    checked = 0
    for numel in [0, 1, world_size + 1, 1000]:
        for dtype, op in cases:
            g = torch.Generator().manual_seed(1000 * rank + numel)
            if dtype.is_floating_point:
                x = (torch.randn(numel, generator=g, dtype=torch.float64) * 3).to(dtype)
            elif op == "product":
                x = torch.randint(1, 3, (numel,), generator=g, dtype=dtype)
            else:
                x = torch.randint(-50, 50, (numel,), generator=g, dtype=dtype)
            expected = x.clone()
            dist.all_reduce(expected, builtin_op[op])
            if op == "avg":
                expected /= world_size
            exact = x.to(torch.float64, copy=True)
            dist.all_reduce(exact, builtin_op[op])
            if op == "avg":
                exact /= world_size
            for name, algorithm in algorithms.items():
                got = x.clone()
                algorithm(got, op)
                checked += 1
                if dtype.is_floating_point:
                    eps = torch.finfo(dtype).eps
                    size = abs(x.to(torch.float64)).clone()
                    dist.all_reduce(size)
                    ok = bool(
                        (got.to(torch.float64) - exact)
                        .abs()
                        .le(world_size * eps * size + 1e-12)
                        .all()
                    )
                else:
                    ok = torch.equal(got, expected)
                if not ok:
                    failures.append(f"{name} numel={numel} {dtype} {op}")
    return checked, failures


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_algorithms_match_builtin(world_size):
    results = distlab.run(_grid_worker, world_size, timeout=240)
    for rank, (checked, failures) in enumerate(results):
        assert checked > 100
        assert failures == [], f"rank {rank}: {failures}"


def _rs_ag_worker(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.collectives import (
        all_to_all,
        ring_all_gather,
        ring_reduce_scatter,
        tree_broadcast,
        tree_reduce,
    )

    n = world_size
    # reduce-scatter, tensor form (like reduce_scatter_tensor)
    x = torch.arange(3.0 * n) * (rank + 1)
    out, ref = torch.empty(3), torch.empty(3)
    ring_reduce_scatter(out, x)
    dist.reduce_scatter(ref, list(x.chunk(n)))
    assert torch.equal(out, ref), (out, ref)
    # reduce-scatter, list form with uneven blocks; the input is left untouched
    blocks = [torch.full((j + 1,), float(rank + j)) for j in range(n)]
    before = [b.clone() for b in blocks]
    out = torch.empty(rank + 1)
    ring_reduce_scatter(out, blocks, op="avg")
    assert all(torch.equal(a, b) for a, b in zip(blocks, before))
    assert torch.allclose(out, torch.full((rank + 1,), sum(r + rank for r in range(n)) / n))
    # all-gather into a tensor and into a list of uneven tensors
    mine = torch.tensor([rank, rank + 0.5])
    gathered = torch.empty(2 * n)
    ring_all_gather(gathered, mine)
    ref = [torch.empty(2) for _ in range(n)]
    dist.all_gather(ref, mine)
    assert torch.equal(gathered, torch.cat(ref))
    uneven = [torch.empty(r + 1, dtype=torch.int64) for r in range(n)]
    ring_all_gather(uneven, torch.full((rank + 1,), rank, dtype=torch.int64))
    assert all(torch.equal(t, torch.full((r + 1,), r)) for r, t in enumerate(uneven))
    # rooted: reduce to and broadcast from a root that is not 0
    root = n - 1
    y = torch.full((5,), float(rank + 1))
    tree_reduce(y, dst=root, op="max")
    if rank == root:
        assert torch.equal(y, torch.full((5,), float(n)))
    z = torch.arange(7, dtype=torch.int64) if rank == root else torch.zeros(7, dtype=torch.int64)
    tree_broadcast(z, src=root)
    assert torch.equal(z, torch.arange(7))
    # all-to-all with uneven blocks: rank r sends j+r+1 elements to rank j
    send = [torch.full((j + rank + 1,), 10 * rank + j) for j in range(n)]
    recv = [torch.empty(rank + j + 1, dtype=torch.int64) for j in range(n)]
    all_to_all(recv, send)
    assert all(
        torch.equal(t, torch.full((rank + j + 1,), 10 * j + rank)) for j, t in enumerate(recv)
    )
    # even blocks: the same as gloo's built-in (which cannot do uneven ones)
    send = [torch.arange(3) + 100 * rank + 10 * j for j in range(n)]
    recv = [torch.empty(3, dtype=torch.int64) for _ in range(n)]
    ref = [torch.empty(3, dtype=torch.int64) for _ in range(n)]
    all_to_all(recv, send)
    dist.all_to_all(ref, send)
    assert all(torch.equal(a, b) for a, b in zip(recv, ref))
    return True


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_reduce_scatter_all_gather_rooted_and_all_to_all(world_size):
    assert distlab.run(_rs_ag_worker, world_size) == [True] * world_size


def _subgroup_worker(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.collectives import ring_all_reduce

    evens = dist.new_group([0, 2])
    odds = dist.new_group([1, 3])
    mine = evens if rank % 2 == 0 else odds
    x = torch.tensor([float(rank)])
    ring_all_reduce(x, group=mine)
    return x.item()


def test_collectives_respect_process_subgroups():
    assert distlab.run(_subgroup_worker, 4) == [2.0, 4.0, 2.0, 4.0]


def _bad_input_worker(rank, world_size, case):
    import torch

    from distlab.collectives import ring_all_reduce, ring_reduce_scatter, tree_all_reduce

    try:
        if case == "shape":
            ring_all_reduce(torch.ones(10 if rank != 2 else 12))
        elif case == "dtype_mismatch":
            tree_all_reduce(torch.ones(4, dtype=torch.float32 if rank else torch.float64))
        elif case == "non_contiguous":
            t = torch.ones(4, 4)
            ring_all_reduce(t.t() if rank == 1 else t)
        elif case == "unsupported_dtype":
            ring_all_reduce(torch.ones(3, dtype=torch.complex64 if rank == 0 else torch.float32))
        elif case == "bad_op":
            ring_all_reduce(torch.ones(3), op="median" if rank == 3 else "sum")
        elif case == "int_avg":
            ring_all_reduce(torch.ones(3, dtype=torch.int64), op="avg")
        elif case == "rs_size":
            ring_reduce_scatter(torch.empty(2), torch.ones(4 * world_size))
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.slow
@pytest.mark.parametrize(
    "case,fragment",
    [
        ("shape", "rank 2 has dtype torch.float32, 12 elements"),
        ("dtype_mismatch", "torch.float64"),
        ("non_contiguous", "rank 1: its tensor is not contiguous"),
        ("unsupported_dtype", "rank 0: its dtype is not supported"),
        ("bad_op", "rank 3: its reduce op is not supported"),
        ("int_avg", "ReduceOp.AVG needs a floating-point tensor"),
        ("rs_size", "wrong number of elements"),
    ],
)
def test_bad_input_fails_on_every_rank_without_hanging(case, fragment):
    messages = distlab.run(_bad_input_worker, 4, args=(case,), timeout=60)
    for message in messages:
        assert fragment in message


def _traffic_worker(rank, world_size):
    import torch

    from distlab.collectives import count_traffic, ring_all_reduce
    from distlab.collectives.agree import unchecked

    x = torch.ones(1200)
    with count_traffic() as traffic:
        ring_all_reduce(x)
    with count_traffic() as without_header, unchecked():
        ring_all_reduce(x)
    return traffic, without_header


def test_traffic_counter_sees_ring_bytes():
    for traffic, without_header in distlab.run(_traffic_worker, 4):
        sent = traffic.bytes_sent
        assert sent == 2 * 3 * 300 * 4  # 2(n-1) messages of N/n float32 elements
        assert traffic.by_schedule == {"ring_all_reduce": sent}
        assert traffic.messages == 2 * 3
        # the agreement header, counted apart: ceil(log2 4) = 2 rounds, one message each
        assert traffic.header_messages == 2
        assert (without_header.bytes_sent, without_header.header_messages) == (sent, 0)


def test_collective_outside_a_process_group_says_how_to_start_one():
    from distlab.collectives import ring_all_reduce

    with pytest.raises(RuntimeError, match="distlab.run"):
        ring_all_reduce(torch.ones(3))


def _mismatched_collectives_worker(rank, world_size, case):
    import torch

    from distlab.collectives import (
        ring_all_gather,
        ring_all_reduce,
        ring_reduce_scatter,
        tree_all_reduce,
    )

    x = torch.arange(4.0 * world_size)
    calls = {
        "ring_all_gather": lambda: ring_all_gather(torch.empty(4 * world_size), x[:4].clone()),
        "ring_reduce_scatter": lambda: ring_reduce_scatter(torch.empty(4), x),
        "ring_all_reduce": lambda: ring_all_reduce(x),
        "tree_all_reduce": lambda: tree_all_reduce(x),
    }
    first, other = case
    try:
        calls[first if rank == 0 else other]()
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize(
    "case",
    [
        ("ring_all_gather", "ring_reduce_scatter"),  # headers used to be identical: wrong data
        ("ring_all_reduce", "ring_all_gather"),  # header widths used to differ: garbage sizes
        ("ring_all_reduce", "tree_all_reduce"),  # used to wait for gloo's 30 s timeout
    ],
    ids=lambda c: f"{c[0]}-vs-{c[1]}",
)
def test_mismatched_collectives_are_refused_on_every_rank(case):
    """Issue 30: the header names the collective and algorithm, so a mismatch is refused at once."""
    messages = distlab.run(_mismatched_collectives_worker, 2, args=(case,), timeout=60)
    for message in messages:
        assert "ranks called different collectives" in message, message
        assert f"rank 0 called {case[0]}" in message and f"rank 1 called {case[1]}" in message


def test_header_round_trip_and_fixed_width():
    from distlab.collectives.agree import header_width, pack_header, unpack_header

    for n in (2, 3, 8, 64):
        long = pack_header("all_to_all", 0, 0, list(range(2 * n + 1)), n)
        short = pack_header("ring_all_reduce", 0, 1, [1, 2, 3], n)
        assert len(long) == len(short) == 4 + 6 + header_width(n)
        assert unpack_header(short) == ("ring_all_reduce", 0, 1, [1, 2, 3])
    assert unpack_header([0] * len(short)) is None


def _unchecked_worker(rank, world_size):
    import torch

    from distlab.collectives import agree, all_to_all, ring_all_reduce

    def no_exchange(*args, **kwargs):
        raise AssertionError("the header exchange ran")

    exchange, agree.all_gather_headers = agree.all_gather_headers, no_exchange
    try:  # a warm worker runs later jobs: give the exchange back however this one ends
        tensor = torch.full((10,), float(rank + 1))
        with agree.unchecked():
            ring_all_reduce(tensor)
            try:
                all_to_all(
                    list(torch.zeros(world_size, 1).unbind()),
                    list(torch.ones(world_size, 1).unbind()),
                )
                refused = None
            except ValueError as error:
                refused = str(error)
        try:
            ring_all_reduce(torch.ones(3))
            checked = None
        except AssertionError as error:
            checked = str(error)
    finally:
        agree.all_gather_headers = exchange
    return tensor.tolist(), refused, checked


def test_unchecked_skips_the_header_exchange_and_only_there():
    """benchmarks/collectives_busbw.py --check both times collectives without the header; the
    switch must skip exactly the exchange (the sum stays right), refuse a collective that needs
    the other ranks' sizes, and end with its block."""
    for total, refused, checked in distlab.run(_unchecked_worker, 2, timeout=120):
        assert total == [3.0] * 10
        assert refused and "cannot run unchecked" in refused, refused
        assert checked == "the header exchange ran", checked


def test_bench_times_with_and_without_the_header_in_the_same_run():
    """``run_bench(check="both")`` (benchmarks/collectives_busbw.py --check both): for each
    size, one record with the header and one without, timed in alternating blocks of the same
    job (the unchecked block really skips the exchange: see above); a built-in, which has no
    header, is timed once."""
    from distlab.commands.bench import BOTH, run_bench

    records = run_bench(
        world_sizes=(2,), algorithms=["builtin", "ring"], sizes=[4096, 1 << 16], iters=5,
        check=BOTH,
    )  # fmt: skip
    ring = sorted((r["bytes"], r["check"]) for r in records if r["algorithm"] == "ring")
    assert ring == [(4096, False), (4096, True), (1 << 16, False), (1 << 16, True)]
    builtin = [r for r in records if r["algorithm"] == "builtin"]
    assert [r["bytes"] for r in builtin] == [4096, 1 << 16] and "check" not in builtin[0]
    assert all(r["time_s"] > 0 for r in records)


def _hierarchical_with(rank, world_size, ranks_per_node, variant):
    import torch

    from distlab.collectives.hierarchical import hierarchical_all_reduce

    try:
        hierarchical_all_reduce(torch.ones(4), ranks_per_node=ranks_per_node, variant=variant)
    except (TypeError, ValueError) as error:
        return str(error)
    return "ran"


@pytest.mark.parametrize(
    "ranks_per_node,variant,message",
    [
        ([2], "leader", "ranks_per_node must be an integer >= 1, got [2]"),
        (2, ["shard"], "variant must be 'leader' or 'shard', got ['shard']"),
        (2, "leader", "ran"),
    ],
)
def test_a_bad_hierarchical_setting_is_named_though_schedules_are_cached(
    ranks_per_node, variant, message
):
    """Schedules are built once per process (api.cached_schedule): a list where a number
    belongs is no cache key, and must still get the builder's own error, not 'unhashable'."""
    assert distlab.run(_hierarchical_with, 2, args=(ranks_per_node, variant)) == [message] * 2


def test_bench_side_by_side_times_every_algorithm_in_one_job():
    """``run_bench(side_by_side=True)`` (benchmarks/collectives_busbw.py): the algorithms of a
    world size share one job, in alternating rounds, with and without the header for
    distlab's; one record per (algorithm, size[, header]), each the median of its rounds."""
    from distlab.commands import bench

    calls = []
    real_run = bench.run

    def counting_run(fn, n, **kwargs):
        calls.append((fn.__name__, n))
        return real_run(fn, n, **kwargs)

    bench.run = counting_run
    try:
        records = bench.run_bench(
            world_sizes=(2,), algorithms=["builtin", "ring", "tree"], sizes=[4096, 1 << 16],
            iters=2, check=bench.BOTH, side_by_side=True,
        )  # fmt: skip
    finally:
        bench.run = real_run
    assert calls == [("_side_by_side_worker", 2)]
    keys = sorted((r["algorithm"], r["bytes"], r.get("check")) for r in records)
    assert keys == sorted(
        [("builtin", b, None) for b in (4096, 1 << 16)]
        + [(a, b, c) for a in ("ring", "tree") for b in (4096, 1 << 16) for c in (True, False)]
    )
    assert all(r["time_s"] > 0 and r["busbw_GBps"] > 0 for r in records)
