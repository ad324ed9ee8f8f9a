"""Pipeline bubbles: Narayanan et al. 2021's formulas, checked against the schedules themselves."""

from __future__ import annotations

import pytest

from distlab.calc.pipeline import (
    PipeOp,
    bubble_fraction,
    in_flight_micro_batches,
    max_in_flight,
    replay,
    schedule_ops,
)


def test_published_formulas():
    # Section 2.2.1: bubble time fraction (p-1)/m of the ideal time ...
    assert bubble_fraction(4, 16, schedule="1f1b", relative_to="ideal") == 3 / 16
    assert bubble_fraction(8, 64, schedule="gpipe", relative_to="ideal") == 7 / 64
    # ... which is (p-1)/(m+p-1) of the whole step
    assert bubble_fraction(4, 8, schedule="gpipe") == 3 / 11
    assert bubble_fraction(4, 1, schedule="gpipe") == 0.75
    # Section 2.2.2: interleaving with v chunks divides the bubble by v
    assert bubble_fraction(
        4, 16, schedule="interleaved", virtual_stages=2, relative_to="ideal"
    ) == (3 / 32)
    assert bubble_fraction(4, 16, schedule="interleaved", virtual_stages=2) == 3 / 35
    assert bubble_fraction(1, 5) == 0.0


def test_in_flight_formulas():
    assert in_flight_micro_batches(4, 32, schedule="gpipe") == 32
    assert in_flight_micro_batches(4, 32, schedule="1f1b") == 4
    assert in_flight_micro_batches(4, 2, schedule="1f1b") == 2
    # Korthikanti et al. 2022, Section 4.2.3: interleaving stores L (1 + (p-1)/(p v)) layers
    p, v = 8, 3
    assert in_flight_micro_batches(p, 64, schedule="interleaved", virtual_stages=v) * (1 / p) == (
        pytest.approx(1 + (p - 1) / (p * v))
    )


GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 7, 8, 16)]


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_replayed_schedule_has_the_formula_bubble(p, m, schedule):
    ops = schedule_ops(p, m, schedule=schedule)
    assert all(len(rank_ops) == 2 * m for rank_ops in ops)
    for t_f, t_b in ((1.0, 2.0), (1.0, 1.0), (0.5, 3.0)):
        timeline = replay(ops, forward_time=t_f, backward_time=t_b)
        assert timeline.makespan == pytest.approx((m + p - 1) * (t_f + t_b))
        assert timeline.bubble_fraction == pytest.approx(bubble_fraction(p, m, schedule=schedule))
    assert max_in_flight(ops[0]) == in_flight_micro_batches(p, m, schedule=schedule)


@pytest.mark.parametrize(
    ("p", "m", "v"),
    [(2, 2, 2), (2, 6, 3), (4, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2), (8, 32, 4), (3, 9, 2)],
)
def test_interleaved_schedule_matches_formula(p, m, v):
    ops = schedule_ops(p, m, schedule="interleaved", virtual_stages=v)
    # each rank runs every micro-batch through each of its v chunks, forward and backward
    for rank_ops in ops:
        assert sorted((o.kind, o.micro_batch, o.chunk) for o in rank_ops) == sorted(
            (k, i, c) for k in "FB" for i in range(m) for c in range(v)
        )
    timeline = replay(ops, forward_time=1.0, backward_time=2.0)
    assert timeline.bubble_fraction == pytest.approx(
        bubble_fraction(p, m, schedule="interleaved", virtual_stages=v)
    )
    assert max_in_flight(ops[0], v) == pytest.approx(
        in_flight_micro_batches(p, m, schedule="interleaved", virtual_stages=v)
    )


def test_one_f_one_b_order_on_first_and_last_stage():
    ops = schedule_ops(4, 6, schedule="1f1b")
    first = " ".join(str(o) for o in ops[0])
    last = " ".join(str(o) for o in ops[3])
    assert first == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"  # 3 warm-up forwards, then 1F1B
    assert last == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


def test_replay_respects_dependencies():
    timeline = replay(schedule_ops(3, 4, schedule="gpipe"))
    end = {(t.rank, t.op.kind, t.op.micro_batch): t.end for t in timeline.ops}
    start = {(t.rank, t.op.kind, t.op.micro_batch): t.start for t in timeline.ops}
    for mb in range(4):
        for r in (1, 2):
            assert start[(r, "F", mb)] >= end[(r - 1, "F", mb)]
        for r in (0, 1):
            assert start[(r, "B", mb)] >= end[(r + 1, "B", mb)]


def test_replay_detects_deadlock():
    bad = [[PipeOp("B", 0), PipeOp("F", 0)], [PipeOp("F", 0), PipeOp("B", 0)]]
    with pytest.raises(ValueError, match="deadlock"):
        replay(bad)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: bubble_fraction(0, 4), "stages must be"),
        (lambda: bubble_fraction(4, -1), "micro_batches must be"),
        (lambda: bubble_fraction(4, 8, schedule="zero_bubble"), "schedule 'zero_bubble'"),
        (lambda: bubble_fraction(4, 8, relative_to="wall"), "relative_to 'wall'"),
        (lambda: bubble_fraction(4, 8, schedule="1f1b", virtual_stages=2), "virtual_stages=2"),
        (
            lambda: schedule_ops(4, 6, schedule="interleaved", virtual_stages=2),
            "multiple of stages",
        ),
        (
            lambda: in_flight_micro_batches(4, 8, schedule="interleaved", virtual_stages=0),
            "virtual_stages must be",
        ),
        (lambda: replay([]), "at least one rank"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
