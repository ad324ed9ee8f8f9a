"""rank_groups against Megatron-core's published examples and an independent brute-force definition."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distlab.core.ranks import coordinates
from distlab.placement import rank_groups


def brute_force_groups(sizes: dict, order: list, members: list) -> list:
    """Megatron's definition spelled out: rank = sum(coord * stride) over ``order`` (first fastest);
    a group fixes every coordinate outside ``members``; groups are listed with the other
    coordinates counting up (first in ``order`` fastest), members likewise inside a group."""
    strides, s = {}, 1
    for name in order:
        strides[name] = s
        s *= sizes[name]
    others = [n for n in order if n not in members]
    mine = [n for n in order if n in members]

    def counting(names):  # all coordinate tuples, first name fastest
        ranges = [range(sizes[n]) for n in reversed(names)]
        for combo in itertools.product(*ranges):
            yield dict(zip(reversed(names), combo, strict=True))

    groups = []
    for fixed in counting(others):
        groups.append(
            [sum(({**fixed, **c}[n]) * strides[n] for n in order) for c in counting(mine)]
        )
    return groups


def test_megatron_initialize_model_parallel_docstring_example():
    # 16 GPUs, tp=2, pp=4 (so dp=2), default order tp-cp-ep-dp-pp
    g = rank_groups(16, tp=2, pp=4, dp=2)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert g["pp"] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]


def test_megatron_masked_groups_docstring_example():
    # generate_masked_orthogonal_rank_groups: tp=2, dp=3, pp=4 in order tp-dp-pp
    g = rank_groups(24, tp=2, dp=3, pp=4, order="tp-dp-pp")
    assert len(g["dp"]) == 8
    assert g["dp"][0] == [0, 2, 4]
    assert g["dp"][1] == [1, 3, 5]
    assert g["dp"][7] == [19, 21, 23]


def test_expert_groups_split_data_parallel():
    g = rank_groups(8, tp=2, dp=4, ep=2)
    assert g["ep"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["expert_dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


dims = st.sampled_from([1, 2, 3, 4])


@settings(max_examples=60, deadline=None)
@given(tp=dims, cp=dims, dp=dims, pp=dims, perm=st.permutations(["tp", "cp", "ep", "dp", "pp"]))
def test_groups_match_brute_force_and_partition(tp, cp, dp, pp, perm):
    world = tp * cp * dp * pp
    order = "-".join(perm)
    g = rank_groups(world, tp=tp, cp=cp, dp=dp, pp=pp, order=order)
    sizes = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    for dim in ("tp", "cp", "dp", "pp"):
        assert g[dim] == brute_force_groups(sizes, list(perm), [dim])
        assert sorted(r for grp in g[dim] for r in grp) == list(range(world))
        assert all(len(grp) == sizes[dim] for grp in g[dim])
    assert g["dp-cp"] == brute_force_groups(sizes, list(perm), ["dp", "cp"])
    # orthogonal dimensions meet in at most one rank, so every rank is one (tp, pp) pair
    for a, b in itertools.combinations(("tp", "cp", "dp", "pp"), 2):
        pairs = {(i, j) for i, x in enumerate(g[a]) for j, y in enumerate(g[b]) if set(x) & set(y)}
        assert all(len(set(g[a][i]) & set(g[b][j])) == 1 for i, j in pairs)
        assert len(pairs) == world


@settings(max_examples=40, deadline=None)
@given(tp=dims, dp=st.sampled_from([2, 4, 6]), pp=dims, ep=st.sampled_from([1, 2]))
def test_expert_groups_live_inside_data_parallel_groups(tp, dp, pp, ep):
    world = tp * dp * pp
    g = rank_groups(world, tp=tp, dp=dp, pp=pp, ep=ep)
    dp_sets = [set(x) for x in g["dp-cp"]]
    for grp in g["ep"] + g["expert_dp"]:
        assert any(set(grp) <= s for s in dp_sets)
    assert sorted(r for grp in g["ep"] for r in grp) == list(range(world))
    assert all(len(grp) == ep for grp in g["ep"])


def test_coordinates_invert_the_layout():
    for rank in range(16):
        c = coordinates(rank, 16, tp=2, pp=4, dp=2)
        assert rank == c["tp"] + 2 * (c["cp"] + 1 * (c["dp"] + 2 * c["pp"]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"world_size": 16, "tp": 2, "pp": 4}, "must equal world_size=16"),
        ({"world_size": 8, "tp": 2, "dp": 4, "ep": 3}, "ep=3 must divide"),
        ({"world_size": 8, "tp": 8, "order": "tp-xp"}, "allowed names"),
        ({"world_size": 8, "tp": 8, "order": "tp-tp"}, "repeats"),
        ({"world_size": 8, "tp": 0, "dp": 8}, "tp must be an integer >= 1"),
    ],
)
def test_bad_degrees_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rank_groups(**kwargs)
