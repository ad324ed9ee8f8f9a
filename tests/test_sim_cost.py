"""Closed forms: the published formulas, and the replay of every schedule agrees with them."""

import math

import pytest

from distlab.sim import (
    algbw,
    all_reduce_lower_bound,
    build_schedule,
    busbw,
    busbw_factor,
    closed_form,
    hierarchical_all_reduce_cost,
    preset,
    simulate,
)
from distlab.sim.algorithms import REGISTRY
from distlab.sim.cost import AlphaBetaCost, log2_ceil
from distlab.sim.topology import Link

CLOSED_FORMS = [name for name, entry in REGISTRY.items() if entry.cost is not None]

LINK = Link("uniform", alpha=7e-6, bandwidth=20e9)
GAMMA = 1 / 40e9
N_BYTES = 4 * 2520 * 97  # every chunk equal for n = 1..10 (2520 = lcm(1..10))


def test_textbook_formulas():
    n, a, b, g = 8, LINK.alpha, LINK.beta, GAMMA
    N = 2**20
    cases = {
        "ring_all_reduce": 2 * 7 * a + 2 * 7 / 8 * N * b + 7 / 8 * N * g,
        "ring_reduce_scatter": 7 * a + 7 / 8 * N * b + 7 / 8 * N * g,
        "ring_all_gather": 7 * a + 7 / 8 * N * b,
        "tree_reduce": 3 * (a + N * b + N * g),
        "tree_broadcast": 3 * (a + N * b),
        "tree_all_reduce": 6 * (a + N * b) + 3 * N * g,
        "halving_doubling_all_reduce": 2 * 3 * a + 2 * 7 / 8 * N * b + 7 / 8 * N * g,
        "naive_all_reduce": 2 * a + 2 * 7 * N * b + 7 * N * g,
        "all_to_all": 7 * a + 7 / 8 * N * b,
        "double_binary_tree_all_reduce": 6 * a + 5 * N * b + 2.5 * N * g,
    }
    for name, expected in cases.items():
        assert closed_form(name, n).time(N, LINK, GAMMA) == pytest.approx(expected, rel=1e-12), name


def test_halving_doubling_pays_two_folding_steps_off_powers_of_two():
    six, four = (
        closed_form("halving_doubling_all_reduce", 6),
        closed_form("halving_doubling_all_reduce", 4),
    )
    assert (six.alpha_terms, six.beta_factor, six.gamma_factor) == (
        four.alpha_terms + 2,
        four.beta_factor + 2,
        four.gamma_factor + 1,
    )


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
@pytest.mark.parametrize("n", range(1, 11))
def test_replay_on_uniform_links_equals_closed_form(name, n):
    if name == "double_binary_tree_all_reduce" and n & (n - 1):
        with pytest.raises(ValueError, match="power of two"):
            closed_form(name, n)
        return
    schedule = build_schedule(name, n)
    for gamma in (0.0, GAMMA):
        replayed = simulate(schedule, LINK, N_BYTES, gamma=gamma).time_s
        assert replayed == pytest.approx(closed_form(name, n).time(N_BYTES, LINK, gamma), rel=1e-12)


@pytest.mark.parametrize("nodes", [2, 4, 8])
@pytest.mark.parametrize("variant", ["leader", "shard"])
def test_hierarchical_closed_form_equals_replay_on_dgx_h100(nodes, variant):
    cluster = preset("dgx-h100", nodes=nodes)
    name = "hierarchical_all_reduce" if variant == "leader" else "hierarchical_shard_all_reduce"
    schedule = build_schedule(name, cluster.world_size, ranks_per_node=8)
    cost = hierarchical_all_reduce_cost(nodes, 8, cluster.intra, cluster.inter, variant=variant)
    size = 4 * 64 * 2**14
    assert simulate(schedule, cluster, size).time_s == pytest.approx(cost.time(size), rel=1e-12)
    assert sum(cost.breakdown(size).values()) == pytest.approx(cost.time(size))


def test_hierarchical_shard_shares_a_single_nic():
    cluster = preset("ethernet", nodes=4)  # 4 GPUs, 1 NIC per node
    k = cluster.gpus_per_node
    cost = hierarchical_all_reduce_cost(
        4, k, cluster.intra, cluster.inter, variant="shard", nics_per_node=1
    )
    assert cost.phases[1].link.bandwidth == cluster.inter.bandwidth / k
    schedule = build_schedule("hierarchical_shard_all_reduce", 16, ranks_per_node=k)
    replay = simulate(schedule, cluster, 4 * 16 * 2**12)
    across = [t for t, port in zip(replay.step_times_s, replay.step_bottlenecks) if "nic" in port]
    inter_phase = cost.phases[1].time(4 * 16 * 2**12)
    assert sum(across) == pytest.approx(inter_phase, rel=1e-12)


def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("all_reduce", 8) == 2 * 7 / 8
    assert busbw_factor("reduce_scatter", 8) == busbw_factor("all_gather", 8) == 7 / 8
    assert busbw_factor("all_to_all", 4) == 3 / 4
    assert busbw_factor("broadcast", 8) == busbw_factor("reduce", 8) == 1.0
    assert busbw("all_reduce", 4, 1e9, 0.5) == algbw(1e9, 0.5) * 1.5 == 3e9


def test_ring_meets_the_all_reduce_lower_bound_at_large_sizes():
    n, size = 8, 4 * 2**28
    bound = all_reduce_lower_bound(n, size, LINK.bandwidth)
    ring = simulate(build_schedule("ring_all_reduce", n), LINK, size)
    assert bound == 2 * 7 / 8 * size / LINK.bandwidth
    assert ring.time_s == pytest.approx(bound + 14 * LINK.alpha)
    assert ring.busbw == pytest.approx(LINK.bandwidth, rel=2e-3)  # busbw -> link speed
    for name in ("tree_all_reduce", "halving_doubling_all_reduce", "naive_all_reduce"):
        assert simulate(build_schedule(name, n), LINK, size).time_s >= bound


def test_log2_ceil_and_single_rank():
    assert [log2_ceil(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    for name in CLOSED_FORMS:
        assert closed_form(name, 1).time(1e6, LINK) == 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        closed_form("ring_all_reduce", 0)
    with pytest.raises(ValueError, match="no closed form for 'bogus'"):
        closed_form("bogus", 4)
    with pytest.raises(ValueError, match="n_bytes must be >= 0"):
        closed_form("ring_all_reduce", 4).time(-1, LINK)
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        busbw_factor("gather", 4)
    with pytest.raises(ValueError, match="variant must be"):
        hierarchical_all_reduce_cost(2, 8, LINK, LINK, variant="ring")
    with pytest.raises(ValueError, match="time_s must be > 0"):
        algbw(1, 0)
    assert isinstance(
        closed_form("ring_all_reduce", 3) + closed_form("tree_reduce", 3), AlphaBetaCost
    )
    assert math.isclose(closed_form("ring_all_reduce", 3).beta_factor, 4 / 3)
