"""``distlab bench``: time every collective and algorithm, nccl-tests style.

For each (collective, algorithm, size) every rank runs a few warm-up
iterations, then ``iters`` timed ones between two barriers; the time of an
iteration is the slowest rank's average. Bandwidths follow nccl-tests
(PERFORMANCE.md in NVIDIA/nccl-tests):

* ``algbw = size / time``, where ``size`` is the buffer size nccl-tests
  reports (all-reduce: the buffer; all-gather: the gathered output;
  reduce-scatter: the full input; all-to-all: the send buffer);
* ``busbw = algbw * factor`` with nccl-tests' factor for the collective
  (:func:`distlab.sim.bandwidth.busbw_factor`, e.g. ``2(n-1)/n`` for all-reduce).

The algorithms come from :data:`distlab.sim.algorithms.REGISTRY`;
``builtin`` is ``torch.distributed``'s own collective. Sizes are read by
:func:`distlab.core.units.size_range`, the rule every ``distlab`` command uses.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass

from distlab.collectives import builtin
from distlab.core.checks import positive_int
from distlab.core.units import format_size, size_range
from distlab.launch import run
from distlab.progress import progress_bar
from distlab.sim import algorithms as registry
from distlab.sim.bandwidth import busbw_factor

#: collective -> algorithms benchmarked (``builtin`` = torch.distributed's own)
ALGORITHMS = {c: ["builtin", *registry.algorithms_for(c)] for c in registry.collectives()}

#: dtypes ``distlab bench`` times (torch names)
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")

#: ``distlab bench``'s default sizes: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB
DEFAULT_SIZES = "4KiB:64MiB:16"


@dataclass
class BenchRecord:
    collective: str
    algorithm: str
    world_size: int
    backend: str
    dtype: str
    bytes: int
    count: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float


def _iterations(size: int) -> int:
    return max(3, min(50, (32 << 20) // size))


def _builtin(collective: str):
    """torch.distributed's own collective, called like distlab's runner for ``collective``."""
    import torch.distributed as dist

    return {
        "all_reduce": dist.all_reduce,
        "reduce_scatter": builtin.reduce_scatter_single(),
        "all_gather": builtin.all_gather_single(),
        "broadcast": lambda x: dist.broadcast(x, 0),
        "reduce": lambda x: dist.reduce(x, 0),
        "all_to_all": dist.all_to_all,
    }[collective]


def _make_op(collective, algorithm, size, n, dtype, device, ranks_per_node):
    """(elements nccl-tests reports, a closure running one collective) on fresh buffers."""
    import torch

    if algorithm == "builtin":
        fn = _builtin(collective)
    else:
        entry = registry.lookup(algorithm, collective)
        fn = entry.runner()
        if entry.two_level:
            fn = _with_ranks_per_node(fn, min(ranks_per_node, n))
    element = torch.tensor([], dtype=dtype).element_size()
    count = max(1, size // element)
    per_rank = max(1, count // n)

    def ones(k):
        return torch.ones(k, dtype=dtype, device=device)

    if collective == "reduce_scatter":
        small, big = ones(per_rank), ones(per_rank * n)
        return per_rank * n, lambda: fn(small, big)
    if collective == "all_gather":
        small, big = ones(per_rank), ones(per_rank * n)
        return per_rank * n, lambda: fn(big, small)
    if collective == "all_to_all":
        send = [ones(per_rank) for _ in range(n)]
        recv = [torch.empty_like(s) for s in send]
        return per_rank * n, lambda: fn(recv, send)
    x = ones(count)  # all_reduce, broadcast, reduce: in place, root 0
    return count, lambda: fn(x)


def _with_ranks_per_node(fn, k):
    return lambda x: fn(x, ranks_per_node=k)


def _time_op(op, repeat: int, sync) -> float:
    """Seconds per call on this rank: two warm-up calls, then ``repeat`` timed between barriers."""
    import time

    for _ in range(2):
        op()
    sync()
    start = time.perf_counter()
    for _ in range(repeat):
        op()
    sync()
    return (time.perf_counter() - start) / repeat


def _set_up(rank: int, backend: str, dtype_name: str):
    """(device, dtype, sync) for a benchmark worker; ``sync()`` waits for the device and
    for every rank."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")

    def sync():
        if backend == "nccl":
            torch.cuda.synchronize()
        dist.barrier()

    return device, getattr(torch, dtype_name), sync


def _bench_worker(
    rank,
    world_size,
    collective,
    algorithm,
    sizes,
    dtype_name,
    iters,
    backend,
    ranks_per_node,
    check=True,
):
    """Runs on every rank: one (collective, algorithm) at every size; rank 0's records count.

    ``check=False`` times distlab's collectives without their agreement header
    (:func:`distlab.collectives.agree.unchecked`), to show what the header costs;
    ``check=BOTH`` times them both ways (:func:`_time_with_and_without_header`)."""
    import contextlib

    import torch
    import torch.distributed as dist

    from distlab.collectives.agree import unchecked

    device, dtype, sync = _set_up(rank, backend, dtype_name)
    both = check == BOTH and algorithm != "builtin"  # a built-in has no header to leave out
    records = []
    for size in sizes:
        count, op = _make_op(collective, algorithm, size, world_size, dtype, device, ranks_per_node)
        repeat = iters or _iterations(size)
        if both:  # (with the header?, seconds per call): a record each
            timed = zip((True, False), _time_with_and_without_header(op, repeat, sync))
        else:
            with contextlib.nullcontext() if check in (True, BOTH) else unchecked():
                timed = [(None, _time_op(op, repeat, sync))]
        for checked, seconds in timed:
            slowest = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            record = _record(
                collective,
                algorithm,
                world_size,
                backend,
                dtype_name,
                count * dtype.itemsize,
                count,
                slowest.item(),
            )
            if checked is not None:
                record["check"] = checked
            records.append(record)
    return records


#: ``check=BOTH``: time distlab's algorithms with and without the agreement header
BOTH = "both"


def _time_with_and_without_header(op, repeat: int, sync, blocks: int = 5) -> tuple[float, float]:
    """Seconds per call with the agreement header and without it (``unchecked``), timed in
    ``blocks`` alternating blocks in the same processes, so that a change in the machine's
    load during the run shifts both alike (timed one after the other, the two differed by
    more than the header costs)."""
    from distlab.collectives.agree import unchecked

    per_block = max(1, repeat // blocks)
    on = off = 0.0
    for _ in range(blocks):
        on += _time_op(op, per_block, sync)
        with unchecked():
            off += _time_op(op, per_block, sync)
    return on / blocks, off / blocks


#: ``side_by_side=True``: rounds of alternating blocks per size; a time is their median
ROUNDS = 7


def _side_by_side_worker(
    rank, world_size, collective, algorithms, sizes, dtype_name, iters, backend,
    ranks_per_node, check,
):  # fmt: skip
    """Runs on every rank: every algorithm of ``algorithms`` at each size, in the same
    processes, timed in :data:`ROUNDS` rounds; each round times one block (``iters`` calls)
    of each algorithm in turn (and, with ``check=BOTH``, each of distlab's with and without
    the header), so a change in the machine's load during the run shifts all of them alike.
    A block's time is the slowest rank's; an algorithm's time is the median of its
    blocks' (a burst of load spoils a block or two, not the comparison)."""
    import contextlib
    import statistics

    import torch
    import torch.distributed as dist

    from distlab.collectives.agree import unchecked

    device, dtype, sync = _set_up(rank, backend, dtype_name)

    def modes(algorithm):  # (record's check key, header on?)
        if algorithm == "builtin":
            return [(None, True)]
        if check == BOTH:
            return [(True, True), (False, False)]
        return [(None, bool(check))]

    records = []
    for size in sizes:
        ops = {
            a: _make_op(collective, a, size, world_size, dtype, device, ranks_per_node)
            for a in algorithms
        }
        per_block = iters or _iterations(size)
        blocks = {(a, key): [] for a in algorithms for key, _ in modes(a)}
        for _ in range(ROUNDS):
            for a, (_, op) in ops.items():
                for key, header in modes(a):
                    with contextlib.nullcontext() if header else unchecked():
                        blocks[a, key].append(_time_op(op, per_block, sync))
        times = torch.tensor(list(blocks.values()), dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # each block: the slowest rank's
        for ((a, key), _), row in zip(blocks.items(), times.tolist()):
            count = ops[a][0]
            record = _record(
                collective, a, world_size, backend, dtype_name, count * dtype.itemsize, count,
                statistics.median(row),
            )  # fmt: skip
            if key is not None:
                record["check"] = key
            records.append(record)
    return records


def _record(collective, algorithm, n, backend, dtype_name, nbytes, count, seconds) -> dict:
    algbw = nbytes / seconds / 1e9
    busbw = algbw * busbw_factor(collective, n)
    return asdict(
        BenchRecord(
            collective, algorithm, n, backend, dtype_name, nbytes, count, seconds, algbw, busbw
        )
    )


def _runs_on(collective: str, algorithm: str, n: int, ranks_per_node: int) -> bool:
    """The shard hierarchical all-reduce needs whole nodes; everything else runs on any ``n``."""
    if algorithm == "hierarchical_shard":
        return n % min(ranks_per_node, n) == 0
    return True


def _plan(world_sizes, collectives_, algorithms, ranks_per_node) -> list[tuple[int, str, str]]:
    """Every (world size, collective, algorithm) to time, in table order."""
    unknown = [c for c in collectives_ if c not in ALGORITHMS]
    if unknown:
        raise ValueError(f"unknown collective(s) {unknown}; allowed: {sorted(ALGORITHMS)}")
    known = {a for c in collectives_ for a in ALGORITHMS[c]}
    if set(algorithms) - known:
        raise ValueError(
            f"unknown algorithm(s) {sorted(set(algorithms) - known)} for {collectives_}; "
            f"allowed: {sorted(known)}"
        )
    for n in world_sizes:
        positive_int("world size", n)
    return [
        (n, c, a)
        for n in world_sizes
        for c in collectives_
        for a in ALGORITHMS[c]
        if (not algorithms or a in algorithms) and _runs_on(c, a, n, ranks_per_node)
    ]


def run_bench(
    *,
    world_sizes=(2, 4),
    collectives=("all_reduce",),
    algorithms=None,
    sizes=(4096, 1 << 16, 1 << 20, 16 << 20, 64 << 20),
    dtype: str = "float32",
    iters: int | None = None,
    backend: str = "gloo",
    ranks_per_node: int = 2,
    progress: bool = False,
    check: bool = True,
    side_by_side: bool = False,
) -> list[dict]:
    """Benchmark and return records (dicts with the :class:`BenchRecord` fields).

    ``check=False`` runs distlab's algorithms without the agreement header that every
    collective exchanges first (for measuring its cost; built-ins have none);
    ``check="both"`` times each size both ways, in alternating blocks in the same processes,
    and gives two records per size, each with a ``check`` key (True: with the header).

    ``side_by_side=True`` times every algorithm of a collective in one job per world size,
    in alternating blocks, each time the median of its blocks (:func:`_side_by_side_worker`):
    for comparing algorithms on a busy or noisy machine, where jobs run one after the other
    can differ by more than the algorithms do.

    ``ranks_per_node`` is the node size the hierarchical all-reduces assume (ranks
    ``0..k-1`` form node 0, ...). ``progress=True`` shows a rich progress bar on stderr,
    one tick per (world size, collective, algorithm), or per (world size, collective)
    side by side.
    """

    positive_int("ranks_per_node", ranks_per_node)
    if iters is not None:
        positive_int("iters", iters)
    plan = _plan(list(world_sizes), list(collectives), list(algorithms or []), ranks_per_node)
    _check_memory(list(sizes), max(world_sizes, default=1), backend)
    records = []
    if side_by_side:
        jobs: dict[tuple[int, str], list[str]] = {}
        for n, collective, algorithm in plan:
            jobs.setdefault((n, collective), []).append(algorithm)
        with progress_bar("distlab bench", total=len(jobs), enabled=progress) as bar:
            for (n, collective), names in jobs.items():
                bar.step(f"{collective}, {n} ranks, side by side")
                args = (collective, names, list(sizes), dtype, iters, backend, ranks_per_node,
                        check)  # fmt: skip
                results = run(_side_by_side_worker, n, backend=backend, timeout=1800, args=args)
                records.extend(results[0])
                bar.advance()
        return records
    with progress_bar("distlab bench", total=len(plan), enabled=progress) as bar:
        for n, collective, algorithm in plan:
            bar.step(f"{collective} {algorithm}, {n} ranks")
            args = (
                collective,
                algorithm,
                list(sizes),
                dtype,
                iters,
                backend,
                ranks_per_node,
                check,
            )
            results = run(_bench_worker, n, backend=backend, timeout=1800, args=args)
            records.extend(results[0])
            bar.advance()
    return records


def _check_memory(sizes: list[int], n: int, backend: str) -> None:
    """Refuse sizes whose buffers (about 3 per rank: input, output, scratch) cannot fit in RAM."""
    if backend != "gloo" or not sizes:
        return
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if 3 * n * max(sizes) > memory:
        raise ValueError(
            f"size {max(sizes)} bytes ({format_size(max(sizes))}) on {n} ranks needs about "
            f"{format_size(3 * n * max(sizes))}"
            f" of memory; this machine has {format_size(memory)}: choose smaller --sizes"
        )


def print_table(records: list[dict], file=sys.stdout) -> None:
    """nccl-tests-like table, one block per (collective, world size)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, width=120)
    keys = sorted({(r["collective"], r["world_size"]) for r in records}, key=lambda k: (k[0], k[1]))
    for collective, n in keys:
        rows = [r for r in records if r["collective"] == collective and r["world_size"] == n]
        table = Table(title=f"{collective}, {n} ranks, {rows[0]['backend']}, {rows[0]['dtype']}")
        for column in (
            "algorithm",
            "size",
            "count",
            "time (us)",
            "algbw (GB/s)",
            "busbw (GB/s)",
            "busbw / builtin",
        ):
            table.add_column(column, justify="right")
        builtin = {r["bytes"]: r["busbw_GBps"] for r in rows if r["algorithm"] == "builtin"}
        for r in rows:
            ratio = (
                r["busbw_GBps"] / builtin[r["bytes"]] if builtin.get(r["bytes"]) else float("nan")
            )
            table.add_row(
                r["algorithm"],
                format_size(r["bytes"]),
                str(r["count"]),
                f"{r['time_s'] * 1e6:.1f}",
                f"{r['algbw_GBps']:.3f}",
                f"{r['busbw_GBps']:.3f}",
                f"{ratio:.2f}",
            )
        console.print(table)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="time distlab's collectives against torch.distributed's (nccl-tests style)"
    )
    p.add_argument("--world-sizes", default="2,4", help="comma-separated, default 2,4")
    p.add_argument(
        "--collectives",
        default="all_reduce",
        help=f"comma-separated or 'all'; from {', '.join(ALGORITHMS)}",
    )
    p.add_argument(
        "--algorithms",
        default=None,
        help="comma-separated subset (default: all for each collective)",
    )
    p.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"lo:hi (doubling), lo:hi:factor or a list 4KiB,1MiB (default {DEFAULT_SIZES})",
    )
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument(
        "--ranks-per-node", type=int, default=2, help="node size for the hierarchical all-reduces"
    )
    p.add_argument(
        "--iters", type=int, default=None, help="timed iterations per point (default: by size)"
    )
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="time the algorithms of a world size in one job, alternating, median of "
        f"{ROUNDS} rounds (to compare them on a busy or noisy machine)",
    )
    p.add_argument("--json", action="store_true", help="print JSON records instead of tables")
    p.set_defaults(func=_main)


def _main(args) -> int:
    collectives = list(ALGORITHMS) if args.collectives == "all" else args.collectives.split(",")
    try:
        world_sizes = [int(w) for w in args.world_sizes.split(",")]
    except ValueError:
        raise ValueError(
            f"--world-sizes must be integers like 2,4, got {args.world_sizes!r}"
        ) from None
    records = run_bench(
        world_sizes=world_sizes,
        collectives=collectives,
        algorithms=args.algorithms.split(",") if args.algorithms else None,
        sizes=size_range(args.sizes),
        dtype=args.dtype,
        iters=args.iters,
        backend=args.backend,
        ranks_per_node=args.ranks_per_node,
        progress=sys.stderr.isatty() and not args.json,
        side_by_side=args.side_by_side,
    )
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        print_table(records)
    return 0
