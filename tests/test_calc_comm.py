"""Communication volumes: ring byte counts, the ZeRO paper's convention, TP/PP, link time."""

from __future__ import annotations

import math

import pytest

from distlab.calc import comm, volume
from distlab.sim.topology import IB_NDR, NVLINK4, Link


@pytest.mark.parametrize("k", [2, 3, 8, 64])
def test_ddp_ring_all_reduce_bytes(k):
    psi = 1e9
    assert comm.ddp_bytes_per_gpu(psi, dp=k, bytes_per_grad=2) == pytest.approx(
        2 * (k - 1) / k * 2 * psi
    )
    v = comm.data_parallel_comm(psi, dp=k)
    assert v.messages == 2 * (k - 1)


def test_zero_paper_convention():
    # Rajbhandari et al. 2020, Section 7: DP 2 Psi, P_os and P_os+g 2 Psi, P_os+g+p 3 Psi (1.5x)
    psi, k = 1e9, 64
    paper = {
        s: comm.data_parallel_comm(
            psi, dp=k, zero_stage=s, bytes_per_param=1, bytes_per_grad=1
        ).zero_paper_bytes
        for s in range(4)
    }
    assert paper == {0: 2 * psi, 1: 2 * psi, 2: 2 * psi, 3: 3 * psi}
    sent = {s: comm.data_parallel_comm(psi, dp=k, zero_stage=s).total for s in range(4)}
    assert sent[0] == pytest.approx(sent[1]) == pytest.approx(sent[2])
    assert sent[3] / sent[0] == pytest.approx(1.5)
    assert comm.fsdp_comm(psi, dp=k).total == pytest.approx(sent[3])


def test_gradient_accumulation_repeats_zero_2_and_3_collectives():
    psi, k, m = 1e9, 8, 4
    ddp = comm.data_parallel_comm(psi, dp=k, micro_batches=m).total
    assert ddp == comm.data_parallel_comm(psi, dp=k).total  # no_sync: one all-reduce per step
    z2 = comm.data_parallel_comm(psi, dp=k, zero_stage=2, micro_batches=m).total
    assert z2 == pytest.approx((m + 1) * (k - 1) / k * 2 * psi)
    z3 = comm.data_parallel_comm(psi, dp=k, zero_stage=3, micro_batches=m).total
    assert z3 == pytest.approx(3 * m * (k - 1) / k * 2 * psi)


def test_tensor_parallel_four_all_reduces_per_layer():
    s, b, h, n_layers, t = 2048, 2, 4096, 10, 8
    v = comm.tensor_parallel_comm(seq_len=s, micro_batch=b, hidden=h, layers=n_layers, tp=t)
    per_all_reduce = 2 * (t - 1) / t * s * b * h * 2
    assert v.total == pytest.approx(4 * n_layers * per_all_reduce)
    sp = comm.tensor_parallel_comm(
        seq_len=s, micro_batch=b, hidden=h, layers=n_layers, tp=t, sequence_parallel=True
    )
    assert sp.total == pytest.approx(v.total)  # all-gather + reduce-scatter = all-reduce
    full = comm.tensor_parallel_comm(
        seq_len=s, micro_batch=b, hidden=h, layers=n_layers, tp=t, recompute="full", micro_batches=3
    )
    assert full.total == pytest.approx(3 * 6 * n_layers * per_all_reduce)


def test_pipeline_point_to_point():
    s, b, h = 2048, 1, 12288
    v = comm.pipeline_parallel_comm(seq_len=s, micro_batch=b, hidden=h, micro_batches=8, pp=4, tp=8)
    assert v.total == pytest.approx(2 * 8 * s * b * h * 2 / 8)
    inter = comm.pipeline_parallel_comm(
        seq_len=s, micro_batch=b, hidden=h, micro_batches=8, pp=4, tp=8, virtual_stages=2
    )
    assert inter.total == pytest.approx(2 * v.total)
    assert (
        comm.pipeline_parallel_comm(seq_len=s, micro_batch=b, hidden=h, micro_batches=8, pp=1).total
        == 0
    )


def test_time_on_link():
    link = Link("test", alpha=1e-5, bandwidth=1e10)
    assert volume.time_on_link(1e9, link) == pytest.approx(1e-5 + 0.1)
    v = comm.data_parallel_comm(1e9, dp=4)
    assert v.time_on(link) == pytest.approx(6 * 1e-5 + 1.5 * 2e9 / 1e10)
    # a tree pays 2 log2(K) latencies instead of 2(K-1); bandwidth term unchanged
    big = comm.data_parallel_comm(1e3, dp=1024)
    ring, tree = big.time_on(link), big.time_on(link, all_reduce="tree")
    assert ring - tree == pytest.approx((2 * 1023 - 2 * math.ceil(math.log2(1024))) * 1e-5)
    assert big.time_on(link, all_reduce="auto") == tree
    assert comm.data_parallel_comm(1e9, dp=8).time_on(NVLINK4) < comm.data_parallel_comm(
        1e9, dp=8
    ).time_on(IB_NDR)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: comm.data_parallel_comm(0, dp=8), "n_params"),
        (lambda: comm.data_parallel_comm(1e9, dp=0), "dp must be"),
        (lambda: comm.data_parallel_comm(1e9, dp=8, zero_stage=5), "zero_stage 5"),
        (
            lambda: comm.tensor_parallel_comm(seq_len=8, micro_batch=1, hidden=8, layers=1, tp=0),
            "tp must be",
        ),
        (lambda: volume.CommPart("x", "reduce", 4, 10), "collective 'reduce'"),
        (lambda: volume.time_on_link(-1, NVLINK4), "n_bytes"),
        (
            lambda: comm.data_parallel_comm(1e9, dp=8).time_on(NVLINK4, all_reduce="magic"),
            "all_reduce 'magic'",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
def test_comm_parts_count_what_the_ring_schedules_send(collective, k):
    """calc.volume's bytes and messages equal the ring schedule's, rank by rank (as sim.cost is)."""
    from distlab.sim.algorithms import lookup

    schedule = lookup("ring", collective).schedule(k)
    chunk = 1000  # bytes per chunk, so the payload divides evenly into k chunks
    part = volume.CommPart("x", collective, k, payload_bytes=chunk * k)
    for rank in range(k):
        sent = schedule.bytes_sent(rank, [chunk] * schedule.n_chunks)
        assert part.bytes_sent == pytest.approx(sent, rel=1e-12)
        steps = sum(1 for step in schedule.steps if any(t.src == rank for t in step))
        assert part.messages == steps


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_broadcast_part_is_distlabs_binomial_tree(k):
    """K ranks together send what the tree schedule sends, (K-1) n; the part counts the
    average, (K-1)/K n per rank, in the schedule's ceil(log2 K) steps."""
    from distlab.collectives.tree import tree_broadcast_schedule

    schedule = tree_broadcast_schedule(k)
    part = volume.CommPart("x", "broadcast", k, 1000, count=3)
    total = sum(schedule.bytes_sent(r, [1000]) for r in range(k))
    assert part.bytes_sent * k == pytest.approx(3 * total) and total == (k - 1) * 1000
    assert part.messages == 3 * schedule.n_steps


def test_which_ring_attention_is_counted():
    """A fused ring (the default) passes K/V round again in backward: 3(cp-1) blocks per layer;
    a ring that keeps its blocks (distlab's, keeps_blocks=True) sends the K/V all-gather's
    2(cp-1). 128K tokens on 16 ranks, 8 K/V heads of 128, bf16: 1,440 and 960 MiB."""
    shape = {"seq_len": 8192, "micro_batch": 1, "hidden": 1024, "layers": 1, "cp": 16}
    fused = comm.context_parallel_comm(**shape)
    keeps = comm.context_parallel_comm(**shape, keeps_blocks=True)
    gather = comm.context_parallel_gather_comm(**shape)
    assert (fused.total / 2**20, keeps.total / 2**20) == (1440, 960)
    assert keeps.total == gather.total and fused.total * 2 == keeps.total * 3
    assert [p.what for p in keeps.parts] == [
        "forward K/V blocks to next rank",
        "backward K/V gradients to next rank",
    ]
    assert sum(p.count for p in fused.parts) == 3 * 15  # messages: cp - 1 hops per pass
