"""Replay: contention on shared ports, bytes per link and rank, placement, hierarchy, crossover."""

import math
import subprocess
import sys

import pytest

from distlab.core.collective_schedule import CollectiveSchedule, Transfer
from distlab.sim import build_schedule, crossover_size, preset, simulate
from distlab.sim.replay import chunk_sizes_bytes
from distlab.sim.topology import Link, shared_bus, uniform_cluster

LINK = Link("u", alpha=1e-5, bandwidth=1e9)


def one_step(n, *transfers, n_chunks=1, collective="all_reduce"):
    return CollectiveSchedule(collective, "hand-made", n, n_chunks, (tuple(transfers),))


def test_one_message_costs_alpha_plus_bytes_over_bandwidth():
    r = simulate(one_step(2, Transfer(0, 1, (0,), reduce=True)), LINK, 4000)
    assert r.time_s == pytest.approx(1e-5 + 4000 / 1e9)
    assert r.bytes_sent_per_rank == (4000, 0)
    assert r.bytes_per_port == {"gpu0 out": 4000, "gpu1 in": 4000}


def test_two_messages_into_one_rank_share_its_in_port():
    s = one_step(3, Transfer(1, 0, (0,), reduce=True), Transfer(2, 0, (0,), reduce=True))
    r = simulate(s, LINK, 4000)
    assert r.time_s == pytest.approx(1e-5 + 2 * 4000 / 1e9)
    assert r.step_bottlenecks == ("gpu0 in",)


def test_disjoint_pairs_on_a_switch_do_not_slow_each_other():
    s = one_step(4, Transfer(0, 1, (0,), reduce=False), Transfer(2, 3, (0,), reduce=False))
    assert simulate(s, LINK, 4000).time_s == pytest.approx(1e-5 + 4000 / 1e9)


def test_on_a_shared_bus_every_message_divides_the_bandwidth():
    s = one_step(4, Transfer(0, 1, (0,), reduce=False), Transfer(2, 3, (0,), reduce=False))
    r = simulate(s, shared_bus(4, LINK), 4000)
    assert r.time_s == pytest.approx(1e-5 + 8000 / 1e9)
    assert r.bytes_per_link_class == {"bus": 8000}


def test_messages_leaving_a_node_share_its_nic():
    cluster = preset("ethernet", nodes=2)  # 4 GPUs per node, one NIC
    transfers = [Transfer(g, 4 + g, (0,), reduce=False) for g in range(4)]
    r = simulate(one_step(8, *transfers), cluster, 4000)
    assert r.time_s == pytest.approx(cluster.inter.alpha + 4 * 4000 / cluster.inter.bandwidth)
    dgx = preset("dgx-h100", nodes=2)  # one NIC per GPU: no sharing
    transfers = [Transfer(g, 8 + g, (0,), reduce=False) for g in range(8)]
    r = simulate(one_step(16, *transfers), dgx, 4000)
    assert r.time_s == pytest.approx(dgx.inter.alpha + 4000 / dgx.inter.bandwidth)
    assert r.bytes_per_link_class == {"network": 8 * 4000}


def test_pcie_box_far_hop_is_the_bottleneck_of_a_ring():
    box = preset("pcie-8gpu")
    r = simulate(build_schedule("ring_all_reduce", 8), box, 4 * 8 * 1000)
    chunk = 4 * 1000
    assert r.step_times_s[0] == pytest.approx(box.far_intra.alpha + chunk / box.far_intra.bandwidth)
    assert {port.split("->")[0] for port in r.step_bottlenecks} <= {
        "node0 pcie-switch0",
        "node0 pcie-switch1",
    }
    # placing the ring so that it crosses the sockets only twice is what it already does;
    # interleaving ranks across the sockets makes every hop a far one
    interleaved = [0, 4, 1, 5, 2, 6, 3, 7]
    slow = simulate(build_schedule("ring_all_reduce", 8), box, 4 * 8 * 1000, placement=interleaved)
    assert slow.time_s > r.time_s
    assert slow.bytes_per_link_class == {"pcie-far": sum(slow.bytes_sent_per_rank)}


def test_bytes_per_rank_match_the_schedule_and_bandwidths_follow_nccl_tests():
    for name in ("ring_all_reduce", "tree_all_reduce", "halving_doubling_all_reduce", "all_to_all"):
        s = build_schedule(name, 6)
        size = 4 * 6 * 1001
        r = simulate(s, LINK, size)
        sizes = chunk_sizes_bytes(size, s.n_chunks)
        assert r.bytes_sent_per_rank == tuple(s.bytes_sent(rank, sizes) for rank in range(6))
        assert r.algbw == pytest.approx(size / r.time_s)
        factor = {"all_reduce": 2 * 5 / 6, "all_to_all": 5 / 6}[s.collective]
        assert r.busbw == pytest.approx(r.algbw * factor)
        assert r.time_s == pytest.approx(sum(r.step_times_s))


def test_uneven_chunks_and_a_single_element():
    s = build_schedule("ring_all_reduce", 4)
    r = simulate(s, LINK, 4 * 10)  # 10 elements -> chunks of 3, 3, 2, 2
    assert chunk_sizes_bytes(40, 4) == [12, 12, 8, 8]
    assert r.time_s == pytest.approx(6 * (1e-5 + 12 / 1e9))
    one = simulate(s, LINK, 4)  # one element: only the rank holding chunk 0 sends
    assert sum(one.bytes_sent_per_rank) == 6 * 4
    assert one.time_s == pytest.approx(6 * (1e-5 + 4 / 1e9))


def test_gamma_charges_reductions_only():
    gamma = 1e-9
    reduce = simulate(one_step(2, Transfer(0, 1, (0,), reduce=True)), LINK, 4000, gamma=gamma)
    copy = simulate(one_step(2, Transfer(0, 1, (0,), reduce=False)), LINK, 4000, gamma=gamma)
    assert reduce.time_s - copy.time_s == pytest.approx(4000 * gamma)


def test_hierarchical_beats_flat_ring_on_four_dgx_h100():
    cluster = preset("dgx-h100", nodes=4)
    flat = build_schedule("ring_all_reduce", 32)
    leader = build_schedule("hierarchical_all_reduce", 32, ranks_per_node=8)
    shard = build_schedule("hierarchical_shard_all_reduce", 32, ranks_per_node=8)
    small, large = 2**12, 2**30
    t = {
        (name, size): simulate(s, cluster, size).time_s
        for name, s in (("flat", flat), ("leader", leader), ("shard", shard))
        for size in (small, large)
    }
    # few steps: both hierarchies win small messages by a wide margin
    assert t["leader", small] < t["flat", small] / 3 and t["shard", small] < t["flat", small] / 3
    # large: shard spreads the inter-node bytes over 8 NICs and wins by > 4x;
    # leader pushes the whole buffer through one NIC per node and loses to the ring
    assert t["shard", large] < t["flat", large] / 4
    assert t["leader", large] > t["flat", large]
    net = simulate(shard, cluster, large).bytes_per_link_class["network"]
    assert net == pytest.approx(simulate(leader, cluster, large).bytes_per_link_class["network"])


@pytest.mark.parametrize("n", [4, 8, 16])
def test_crossover_tree_wins_below_ring_above(n):
    at = crossover_size(n, LINK)
    grid = 4 * n  # the replay searches sizes where all n chunks are equal
    assert abs(at - crossover_size(n, LINK, method="replay")) <= grid
    tree, ring = build_schedule("tree_all_reduce", n), build_schedule("ring_all_reduce", n)
    below, above = grid * max(1, int(at / 2 / grid)), grid * int(2 * at / grid)
    assert simulate(tree, LINK, below).time_s < simulate(ring, LINK, below).time_s
    assert simulate(tree, LINK, above).time_s > simulate(ring, LINK, above).time_s


def test_crossover_edge_cases():
    assert crossover_size(2, LINK) == 0.0  # on 2 ranks the tree is never faster
    assert crossover_size(8, LINK, small="ring_all_reduce", large="ring_all_reduce") == 0.0
    assert crossover_size(8, LINK, small="halving_doubling_all_reduce") == math.inf
    with pytest.raises(ValueError, match="swap small and large"):
        crossover_size(8, LINK, small="ring_all_reduce", large="tree_all_reduce")
    with pytest.raises(TypeError, match="needs a Link"):
        crossover_size(8, preset("dgx-h100"))
    on_cluster = crossover_size(32, preset("dgx-h100"), method="replay")
    assert 0 < on_cluster < math.inf


def test_bad_inputs_name_the_value():
    s = build_schedule("ring_all_reduce", 4)
    with pytest.raises(ValueError, match="n_bytes must be an integer >= 1, got 0"):
        simulate(s, LINK, 0)
    with pytest.raises(ValueError, match="n_bytes must be an integer >= 1, got -8"):
        simulate(s, LINK, -8)
    with pytest.raises(ValueError, match="not a whole number of 4-byte elements"):
        simulate(s, LINK, 6)
    with pytest.raises(ValueError, match="64 ranks but cluster 'dgx-h100' has only 32 GPUs"):
        simulate(build_schedule("ring_all_reduce", 64), "dgx-h100", 4096)
    with pytest.raises(ValueError, match="unknown cluster preset 'dgx-b300'"):
        simulate(s, "dgx-b300", 4096)
    with pytest.raises(ValueError, match="placement has 3 entries"):
        simulate(s, uniform_cluster(8, LINK), 4096, placement=[0, 1, 2])
    with pytest.raises(ValueError, match="two ranks on one GPU"):
        simulate(s, uniform_cluster(8, LINK), 4096, placement=[0, 1, 1, 2])
    with pytest.raises(
        ValueError, match=r"placement's GPU \(cluster 'uniform'\) must be an integer in 0..7, got 9"
    ):
        simulate(s, uniform_cluster(8, LINK), 4096, placement=[0, 1, 2, 9])
    with pytest.raises(TypeError, match="ClusterSpec, a preset name or a Link"):
        simulate(s, 3.5, 4096)
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        simulate(s, LINK, 4096, gamma=-1.0)


def test_ring_replay_on_many_ranks():
    n = 256
    schedule = build_schedule("ring_all_reduce", n)
    cluster = preset("dgx-h100", nodes=n // 8)
    r = simulate(schedule, cluster, 2**30)
    assert len(r.step_times_s) == 2 * (n - 1)
    assert r.bytes_per_link_class["network"] == 2 * (n - 1) * (n // 8) * 2**30 // n


def test_simulator_never_imports_torch():
    code = (
        "import sys, distlab.sim, distlab.sim.fit, distlab.commands.sim\n"
        "from distlab.sim import build_schedule, simulate, crossover_size, preset\n"
        "for name in ('ring_all_reduce', 'hierarchical_shard_all_reduce', 'all_to_all'):\n"
        "    simulate(build_schedule(name, 16, ranks_per_node=8), preset('dgx-h100'), 4096)\n"
        "crossover_size(8, preset('dgx-h100'), method='replay')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
