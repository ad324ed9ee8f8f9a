"""Sharded-matmul algebra: the notation, the four cases, each plan's bytes from the ring
formulas, and every plan run on 2 and 4 gloo processes against the dense product.

The bytes per rank are stated here from the ring counts, not from distlab.calc: an
all-gather or a reduce-scatter sends (n-1)/n of the whole buffer, an all-reduce twice that.
"""

from __future__ import annotations

import dataclasses

import pytest

from distlab.parallel.sharding import (
    CASES,
    best_plan,
    matmul_case,
    measure_plans,
    plan_with,
    plans,
    sharded,
)

SIZES = {"I": 8, "J": 12, "K": 4}
PAIRS = {  # (A, B) -> case
    ("A[I, J]", "B[J, K]"): "local",
    ("A[I_x, J]", "B[J, K]"): "local",
    ("A[I, J]", "B[J, K_x]"): "local",
    ("A[I, J_x]", "B[J, K]"): "one-contracting",
    ("A[I, J]", "B[J_x, K]"): "one-contracting",
    ("A[I_x, J]", "B[J_x, K]"): "one-contracting",
    ("A[I, J_x]", "B[J, K_x]"): "one-contracting",
    ("A[I, J_x]", "B[J_x, K]"): "both-contracting",
    ("A[I_x, J]", "B[J, K_x]"): "same-axis-outputs",
}


def ring(n: int, collective: str, elements: int) -> float:
    """Bytes one rank sends for a float32 buffer of ``elements`` (the whole buffer)."""
    factor = 2 if collective == "all_reduce" else 1
    return factor * (n - 1) / n * elements * 4


# ------------------------------------------------------------------ notation ---
def test_notation_reads_and_writes_the_same():
    a = sharded("A[ I , J_x]")
    assert str(a) == "A[I, J_x]" and a.axis_of("J") == "x" and a.axis_of("I") is None
    assert a.local_shape(SIZES, {"x": 4}) == (8, 3)
    assert sharded(a) is a


@pytest.mark.parametrize(
    "text,match",
    [
        ("A[I_x, J_x]", "mesh axis 'x' splits two dimensions"),
        ("A[I, I]", "appears twice"),
        ("A(I, J)", "is not NAME"),
        ("A[I, 2J]", "'2J' is not a dimension"),
    ],
)
def test_bad_shardings_are_named(text, match):
    with pytest.raises(ValueError, match=match):
        sharded(text)


def test_a_dimension_that_does_not_split_evenly_is_named():
    with pytest.raises(ValueError, match="J of size 12 does not split into 8"):
        sharded("A[I, J_x]").local_shape(SIZES, {"x": 8})


# --------------------------------------------------------------------- cases ---
@pytest.mark.parametrize("pair,case", PAIRS.items(), ids=lambda v: str(v))
def test_each_pair_falls_in_its_case(pair, case):
    assert matmul_case(*pair) == case and case in CASES


def test_operands_must_contract_one_shared_dimension():
    with pytest.raises(ValueError, match="contracting dimension last"):
        matmul_case("A[I, J]", "B[K, J]")
    with pytest.raises(ValueError, match="one axis"):
        plans("A[I, J_x]", "B[J, K]", SIZES, {"x": 2, "y": 2})
    with pytest.raises(ValueError, match="'y' is not in the mesh"):
        plans("A[I, J_y]", "B[J, K]", SIZES, {"x": 2})


# --------------------------------------------------------------------- bytes ---
@pytest.mark.parametrize("n", [2, 4])
def test_bytes_per_rank_are_the_ring_counts(n):
    mesh, (i, j, k) = {"x": n}, SIZES.values()
    gather_a = plan_with([("all_gather", "A")], "A[I, J_x]", "B[J, K]", SIZES, mesh, out="C[I, K]")
    reduce_c = plan_with([("all_reduce", "C")], "A[I, J_x]", "B[J, K]", SIZES, mesh, out="C[I, K]")
    scatter = plan_with(
        [("reduce_scatter", "C")], "A[I, J_x]", "B[J_x, K]", SIZES, mesh, out="C[I, K_x]"
    )
    assert gather_a.bytes_per_rank == ring(n, "all_gather", i * j)
    assert reduce_c.bytes_per_rank == ring(n, "all_reduce", i * k)
    assert scatter.bytes_per_rank == ring(n, "reduce_scatter", i * k)
    none = best_plan("A[I_x, J]", "B[J, K]", SIZES, mesh)
    assert none.communication == [] and none.bytes_per_rank == 0 and str(none.out) == "C[I_x, K]"


def test_gather_first_or_reduce_after_follows_the_sizes():
    """A[I, J_x] @ B[J, K] = C[I, K]: gathering A costs I J, all-reducing C 2 I K."""
    mesh = {"x": 4}
    wide_j = best_plan("A[I, J_x]", "B[J, K]", {"I": 8, "J": 64, "K": 8}, mesh, out="C[I, K]")
    narrow_j = best_plan("A[I, J_x]", "B[J, K]", {"I": 8, "J": 8, "K": 64}, mesh, out="C[I, K]")
    assert wide_j.communication == [("all_reduce", "C")]
    assert narrow_j.communication == [("all_gather", "A")]
    kept = best_plan("A[I, J_x]", "B[J, K]", {"I": 8, "J": 64, "K": 8}, mesh, out="C[I_x, K]")
    assert kept.communication == [("reduce_scatter", "C")]


def test_same_axis_outputs_gather_the_smaller_operand():
    mesh = {"x": 4}
    big_a = best_plan("A[I_x, J]", "B[J, K_x]", {"I": 64, "J": 8, "K": 8}, mesh)
    big_b = best_plan("A[I_x, J]", "B[J, K_x]", {"I": 8, "J": 8, "K": 64}, mesh)
    assert big_a.communication == [("all_gather", "B")] and str(big_a.out) == "C[I_x, K]"
    assert big_b.communication == [("all_gather", "A")] and str(big_b.out) == "C[I, K_x]"


def test_fsdp_pattern_can_only_gather_the_weight():
    """A[I_x, J] @ B[J_x, K]: x already splits A's I, so A cannot take a slice of J."""
    (plan,) = plans("A[I_x, J]", "B[J_x, K]", SIZES, {"x": 4}, out="C[I_x, K]")[:1]
    assert plan.communication == [("all_gather", "B")]


def test_plan_with_lists_the_plans_it_knows():
    with pytest.raises(ValueError, match=r"the plans are: \[\('reduce_scatter', 'C'\)\]"):
        plan_with([("all_gather", "A")], "A[I, J_x]", "B[J_x, K]", SIZES, {"x": 2},
                  out="C[I_x, K]")  # fmt: skip


# ----------------------------------------------------------- real processes ---
@pytest.mark.parametrize("n", [2, 4])
def test_every_plan_is_exact_and_sends_its_formula(n):
    mesh, runs = {"x": n}, []
    for a, b in PAIRS:
        runs += plans(a, b, SIZES, mesh)
    measured = measure_plans(runs, SIZES, mesh, seed=n)
    problems = [
        f"{m.plan}: error {m.max_error}, sent {m.bytes_sent}, formula {m.formula_bytes}"
        for m in measured
        if not m.matches
    ]
    assert not problems, "\n".join(problems)
    assert {str(m.plan.out) for m in measured} == {"C[I, K]", "C[I_x, K]", "C[I, K_x]"}
    assert any(m.bytes_sent[0] > 0 for m in measured)


def test_a_wrong_plan_is_caught():
    """Partial sums left unreduced, and a reduce-scatter along the wrong dimension."""
    mesh = {"x": 2}
    right = plan_with([("reduce_scatter", "C")], "A[I, J_x]", "B[J_x, K]", SIZES, mesh,
                      out="C[I, K_x]")  # fmt: skip
    unreduced = dataclasses.replace(right, steps=right.steps[:1], out=right.steps[0].result)
    scatter = right.steps[1]
    wrong_dim = dataclasses.replace(
        right, steps=(right.steps[0], dataclasses.replace(scatter, dim="I"))
    )
    measured = measure_plans([unreduced, wrong_dim], SIZES, mesh)
    assert all(m.max_error > 0 and not m.matches for m in measured), measured


@pytest.mark.slow  # 4 processes: 5-25 s
def test_an_all_reduce_in_two_calls_is_a_plan():
    """A reduce-scatter then an all-gather of C sends an all-reduce's bytes: plan_with takes it
    (partial sums of both operands, or of one sliced), and it runs exact, each rank sending
    what the formula says; the two calls in the other order are no plan."""
    mesh, two = {"x": 4}, []
    for a, b in (("A[I, J_x]", "B[J_x, K]"), ("A[I, J_x]", "B[J, K]")):
        calls = [("reduce_scatter", "C"), ("all_gather", "C")]
        two.append(plan_with(calls, a, b, SIZES, mesh, out="C[I, K]"))
        one = plan_with([("all_reduce", "C")], a, b, SIZES, mesh, out="C[I, K]")
        assert two[-1].communication == calls
        assert two[-1].bytes_per_rank == one.bytes_per_rank
        with pytest.raises(ValueError, match="no plan has the collectives"):
            plan_with(calls[::-1], a, b, SIZES, mesh, out="C[I, K]")
    for m in measure_plans(two, SIZES, mesh):
        assert m.matches, (str(m.plan), m.max_error, m.bytes_sent, m.formula_bytes)
