"""Every schedule, played symbolically, ends in its collective's defining state.

Pure Python: runs in milliseconds for world sizes 1..16 (powers of two and
not), so an algorithm bug shows up here before any process is started.
"""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distlab.core.collective_schedule import CollectiveSchedule, Transfer, chunk_bounds, trace
from distlab.sim.algorithms import SCHEDULES

SIZES = range(1, 17)


def everyone(n):
    return Counter(range(n))


def final(schedule):
    return trace(schedule)[-1]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    "name",
    [
        "ring_all_reduce",
        "tree_all_reduce",
        "double_binary_tree_all_reduce",
        "halving_doubling_all_reduce",
        "naive_all_reduce",
    ],
)
def test_all_reduce_schedules_sum_every_rank_exactly_once(name, n):
    end = final(SCHEDULES[name](n))
    assert all(chunk == everyone(n) for rank in end for chunk in rank)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("per_node", [1, 2, 3, 4, 8])
def test_hierarchical_leader_schedule(n, per_node):
    end = final(SCHEDULES["hierarchical_all_reduce"](n, per_node))
    assert all(chunk == everyone(n) for rank in end for chunk in rank)


@pytest.mark.parametrize("n,per_node", [(4, 2), (6, 3), (8, 4), (8, 2), (9, 3), (12, 4)])
def test_hierarchical_shard_schedule(n, per_node):
    end = final(SCHEDULES["hierarchical_all_reduce"](n, per_node, "shard"))
    assert all(chunk == everyone(n) for rank in end for chunk in rank)


def test_hierarchical_shard_rejects_ragged_nodes():
    with pytest.raises(ValueError, match="not a multiple of ranks_per_node"):
        SCHEDULES["hierarchical_all_reduce"](6, 4, "shard")


@pytest.mark.parametrize("n", SIZES)
def test_ring_reduce_scatter_leaves_chunk_r_on_rank_r(n):
    end = final(SCHEDULES["ring_reduce_scatter"](n))
    assert all(end[r][r] == everyone(n) for r in range(n))


@pytest.mark.parametrize("n", SIZES)
def test_ring_all_gather_gives_everyone_everything(n):
    end = final(SCHEDULES["ring_all_gather"](n))
    assert all(end[r][c] == Counter([c]) for r in range(n) for c in range(n))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("root", [0, 1, 5])
def test_tree_reduce_and_broadcast(n, root):
    root = root % n
    end = final(SCHEDULES["tree_reduce"](n, root))
    assert end[root][0] == everyone(n)
    end = final(SCHEDULES["tree_broadcast"](n, root))
    assert all(end[r][0] == Counter([root]) for r in range(n))


@pytest.mark.parametrize("n", SIZES)
def test_all_to_all_transposes(n):
    end = final(SCHEDULES["all_to_all"](n))
    assert all(end[r][j] == Counter([(j, r)]) for r in range(n) for j in range(n))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_step_counts_match_the_textbook(n):
    log = (n - 1).bit_length()
    assert SCHEDULES["ring_all_reduce"](n).n_steps == 2 * (n - 1)
    assert SCHEDULES["tree_all_reduce"](n).n_steps == 2 * log
    power = 1 << (n.bit_length() - 1)
    extra = 2 if power != n else 0
    assert (
        SCHEDULES["halving_doubling_all_reduce"](n).n_steps == 2 * (power.bit_length() - 1) + extra
    )


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_ring_is_bandwidth_optimal(n):
    """Each rank sends 2(n-1)/n of the buffer: the all-reduce lower bound."""
    schedule = SCHEDULES["ring_all_reduce"](n)
    chunk_bytes = [b - a for a, b in chunk_bounds(n * 1000, n)]
    for r in range(n):
        assert schedule.bytes_sent(r, chunk_bytes) == 2 * (n - 1) * 1000


def test_invalid_schedules_are_rejected():
    with pytest.raises(ValueError, match="outside"):
        CollectiveSchedule("all_reduce", "bad", 2, 1, ((Transfer(0, 2, (0,), True),),))
    with pytest.raises(ValueError, match="reads and writes"):
        CollectiveSchedule(
            "all_reduce", "bad", 2, 1, ((Transfer(0, 1, (0,), True), Transfer(1, 0, (0,), True)),)
        )
    with pytest.raises(ValueError, match="unknown collective"):
        CollectiveSchedule("gossip", "bad", 2, 1, ())


@settings(max_examples=200, deadline=None)
@given(numel=st.integers(0, 10_000), n_chunks=st.integers(1, 64))
def test_chunk_bounds_cover_the_buffer(numel, n_chunks):
    bounds = chunk_bounds(numel, n_chunks)
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert all(a == prev_b for (a, _), (_, prev_b) in zip(bounds[1:], bounds))
