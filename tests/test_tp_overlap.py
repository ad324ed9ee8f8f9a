"""The collective matmul (distlab.parallel.tensor.overlap) on 2 and 4 gloo processes.

Both versions of each layer must equal the dense matmul exactly (integer-valued fp32
inputs: every product and sum is exact, whatever the order), and their timelines must
have the structure that makes overlap possible: the serial version communicates, then
computes; the overlapped one posts each transfer before the matmul it hides behind and
waits after it. On a size where compute dominates, the overlapped gather exposes less
communication than the serial one (a comparison within one run, not a time limit).
"""

from __future__ import annotations

import functools

import pytest
import torch

import distlab
from distlab.parallel.tensor.overlap import (
    Interval,
    Timeline,
    exposed_communication_seconds,
    overlapped_communication_seconds,
)

TOKENS, K, N = 8, 12, 6  # tokens per rank, in features, out features per rank


def dense(world: int):
    """Integer-valued x (tokens x k) and w (k x n*world): exact in fp32."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (world * TOKENS, world * K), generator=gen).float()
    w = torch.randint(-3, 4, (world * K, world * N), generator=gen).float()
    return x, w


def _worker(rank, world):
    torch.set_num_threads(1)
    from distlab.parallel.tensor import overlap as o

    x, w = dense(world)
    gather_in, columns = x.chunk(world, 0)[rank], w.chunk(world, 1)[rank]
    rows_in, rows = x.chunk(world, 1)[rank], w.chunk(world, 0)[rank]
    batched = x.reshape(2, world * TOKENS // 2, world * K).chunk(world, 1)[rank]
    out = {
        "gather": {f.__name__: f(gather_in, columns) for f in (o.serial_gather_matmul, o.overlapped_gather_matmul)},
        "scatter": {f.__name__: f(rows_in, rows) for f in (o.serial_matmul_reduce_scatter, o.overlapped_matmul_reduce_scatter)},
        "batched": o.overlapped_gather_matmul(batched, columns, dim=1)[0],
    }  # fmt: skip
    if world == 4:  # two groups of two, {0, 2} and {1, 3}: ring neighbours are global ranks
        import torch.distributed as dist

        groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        x2, w2 = dense(2)
        mine = x2.chunk(2, 0)[rank // 2]
        out["subgroup"] = o.overlapped_gather_matmul(mine, w2, groups[rank % 2])[0]
    if world == 2:
        out["exposed"] = _exposed_on_a_compute_bound_size(rank)
    return out


def _exposed_on_a_compute_bound_size(rank):
    """Best of three exposed-communication seconds per version, on a size where one chunk's
    matmul takes far longer than sending it."""
    from distlab.parallel.tensor import overlap as o

    gen = torch.Generator().manual_seed(rank)
    x, w = torch.randn(512, 1024, generator=gen), torch.randn(1024, 512, generator=gen)
    versions = {"serial": o.serial_gather_matmul, "overlapped": o.overlapped_gather_matmul}
    exposed = {name: [] for name in versions}
    for repeat in range(4):  # the first repeat warms up (allocations, gloo's connections)
        for name, f in versions.items():
            _, timeline = f(x, w)
            if repeat:
                exposed[name].append(o.exposed_communication_seconds(timeline))
    return {name: min(values) for name, values in exposed.items()}


@functools.cache
def results(world: int):
    return distlab.run(_worker, world, timeout=180, show_output=False)


@pytest.mark.parametrize("world", [2, 4])
def test_gather_matmul_equals_the_dense_matmul(world):
    x, w = dense(world)
    for rank, res in enumerate(results(world)):
        expected = x @ w.chunk(world, 1)[rank]
        for name, (y, _) in res["gather"].items():
            assert torch.equal(y, expected), name
        batched = x.reshape(2, world * TOKENS // 2, world * K) @ w.chunk(world, 1)[rank]
        assert torch.equal(res["batched"], batched)


def test_overlapped_gather_runs_on_a_subgroup():
    x, w = dense(2)
    for res in results(4):
        assert torch.equal(res["subgroup"], x @ w)


@pytest.mark.parametrize("world", [2, 4])
def test_matmul_reduce_scatter_equals_the_dense_matmul(world):
    x, w = dense(world)
    full = x @ w
    for rank, res in enumerate(results(world)):
        for name, (y, _) in res["scatter"].items():
            assert torch.equal(y, full.chunk(world, 0)[rank]), name


def _contains(outer: Interval, inner: Interval) -> bool:
    return outer.start <= inner.start and inner.end <= outer.end


@pytest.mark.parametrize("world", [2, 4])
def test_serial_versions_communicate_then_compute_without_overlap(world):
    for res in results(world):
        for name, (_, timeline) in (*res["gather"].items(), *res["scatter"].items()):
            if not name.startswith("serial"):
                continue
            (comm,), (compute,) = timeline.of_kind("comm"), timeline.of_kind("compute")
            first, second = (comm, compute) if "gather" in name else (compute, comm)
            assert first.end <= second.start, name
            assert overlapped_communication_seconds(timeline) == 0
            assert exposed_communication_seconds(timeline) == pytest.approx(comm.seconds)


@pytest.mark.parametrize("world", [2, 4])
def test_overlapped_gather_hides_each_transfer_behind_a_chunk_matmul(world):
    for rank, res in enumerate(results(world)):
        _, timeline = res["gather"]["overlapped_gather_matmul"]
        assert timeline.rank == rank
        computes, comms = timeline.of_kind("compute"), timeline.of_kind("comm")
        order = [(rank - step) % world for step in range(world)]
        assert [c.label for c in computes] == [f"chunk {j} @ W" for j in order]
        assert len(comms) == world - 1
        for comm, compute in zip(comms, computes, strict=False):
            assert _contains(comm, compute)  # posted before the matmul, waited for after it
        assert overlapped_communication_seconds(timeline) > 0
        assert exposed_communication_seconds(timeline) < timeline.busy_seconds("comm")


@pytest.mark.parametrize("world", [2, 4])
def test_overlapped_reduce_scatter_receives_each_sum_behind_a_chunk_matmul(world):
    for rank, res in enumerate(results(world)):
        _, timeline = res["scatter"]["overlapped_matmul_reduce_scatter"]
        matmuls = [c for c in timeline.of_kind("compute") if c.label.endswith("@ W")]
        order = [(rank + step + 1) % world for step in range(world)]
        assert [c.label for c in matmuls] == [f"chunk {j} @ W" for j in order]
        incoming = [c for c in timeline.of_kind("comm") if c.label.endswith(" in")]
        assert len(incoming) == world - 1
        for comm, compute in zip(incoming, matmuls[1:], strict=True):
            assert _contains(comm, compute)
        assert overlapped_communication_seconds(timeline) > 0


def test_overlapped_gather_exposes_less_communication_when_compute_dominates():
    res = results(2)
    serial = sum(r["exposed"]["serial"] for r in res)
    overlapped = sum(r["exposed"]["overlapped"] for r in res)
    assert overlapped < serial


def test_exposed_communication_counts_comm_outside_compute_once():
    timeline = Timeline(0)
    timeline.add("comm", 0.0, 4.0)
    timeline.add("comm", 1.0, 3.0)  # inside the first: counted once
    timeline.add("compute", 1.0, 2.0)
    timeline.add("compute", 3.0, 5.0)
    assert timeline.busy_seconds("comm") == 4.0
    assert overlapped_communication_seconds(timeline) == 2.0
    assert exposed_communication_seconds(timeline) == 2.0  # [0, 1] and [2, 3]
    shifted = timeline.shifted(1.0)
    assert (shifted.start, shifted.end) == (-1.0, 4.0)
    assert exposed_communication_seconds(shifted) == 2.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="kind must be one of"):
        Interval("waiting", 0.0, 1.0)
    with pytest.raises(ValueError, match="ends"):
        Interval("comm", 2.0, 1.0, "late")
    from distlab.parallel.tensor.overlap import overlapped_gather_matmul, serial_gather_matmul

    with pytest.raises(ValueError, match="contracted"):  # checked before any collective
        overlapped_gather_matmul(torch.zeros(4, 3), torch.zeros(3, 2), dim=-1)
    with pytest.raises(ValueError, match="expects 5"):
        serial_gather_matmul(torch.zeros(4, 3), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="must be a matrix"):
        serial_gather_matmul(torch.zeros(4, 3), torch.zeros(3))


def test_plot_draws_compute_and_comm_rows_for_every_rank():
    from distlab.viz.tp_overlap_plots import plot_overlap_timelines

    res = results(2)
    fig = plot_overlap_timelines(
        [r["gather"]["serial_gather_matmul"][1] for r in res],
        [r["gather"]["overlapped_gather_matmul"][1] for r in res],
    )
    serial_ax, overlapped_ax = fig.axes
    for ax in (serial_ax, overlapped_ax):
        assert len(ax.collections) == 2 * 2  # compute and comm rows of 2 ranks
        assert "exposed communication" in ax.get_title()
    bars = overlapped_ax.collections[0].get_paths()
    assert len(bars) == 2  # rank 0's two chunk matmuls
