"""Pipeline bubbles: Narayanan et al. 2021's formulas, checked against the schedules themselves."""

from __future__ import annotations

import pytest

from distlab.calc.pipeline import (
    bubble_fraction,
    dualpipe_bubble_time,
    in_flight_micro_batches,
    replay,
    schedule_ops,
    zb_h1_bubble_time,
    zb_h2_bubble_time,
)
from distlab.core.pipeline_schedule import PipelineSchedule
from distlab.sim.pipeline_replay import ScheduleError


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
    plan = schedule_ops(p, m, schedule=schedule)
    assert all(len(actions) == 2 * m for actions in plan.ranks)
    for t_f, t_b in ((1.0, 2.0), (1.0, 1.0), (0.5, 3.0)):
        timeline = replay(plan, forward_time=t_f, backward_time=t_b)
        assert timeline.makespan == pytest.approx((m + p - 1) * (t_f + t_b))
        assert timeline.bubble_fraction == pytest.approx(bubble_fraction(p, m, schedule=schedule))
        assert timeline.bubble_over_ideal == pytest.approx(
            bubble_fraction(p, m, schedule=schedule, relative_to="ideal")
        )
    assert timeline.peak_in_flight[0] == in_flight_micro_batches(p, m, schedule=schedule)


@pytest.mark.parametrize(
    ("p", "m", "v"),
    [(2, 2, 2), (2, 6, 3), (4, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2), (8, 32, 4), (3, 9, 2)],
)
def test_interleaved_schedule_matches_formula(p, m, v):
    plan = schedule_ops(p, m, schedule="interleaved", virtual_stages=v)
    # each rank runs every micro-batch through each of its v chunks, forward and backward
    for actions in plan.ranks:
        assert sorted((a.kind, a.micro_batch, a.chunk) for a in actions) == sorted(
            (k, i, c) for k in "FB" for i in range(m) for c in range(v)
        )
    timeline = replay(plan, forward_time=1.0, backward_time=2.0)
    assert timeline.bubble_fraction == pytest.approx(
        bubble_fraction(p, m, schedule="interleaved", virtual_stages=v)
    )
    assert timeline.bubble_over_ideal == pytest.approx(
        bubble_fraction(p, m, schedule="interleaved", virtual_stages=v, relative_to="ideal")
    )
    assert timeline.peak_in_flight[0] / v == pytest.approx(
        in_flight_micro_batches(p, m, schedule="interleaved", virtual_stages=v)
    )


@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 4, 5, 8, 13)])
def test_zb_h1_replay_matches_qi_et_al(p, m):
    plan = schedule_ops(p, m, schedule="zb_h1")
    for t_f, t_b, share in ((1.0, 2.0, 0.5), (1.0, 3.0, 1 / 3), (2.0, 3.0, 0.3)):
        timeline = replay(plan, forward_time=t_f, backward_time=t_b, weight_fraction=share)
        t_i, t_w = t_b * (1 - share), t_b * share
        one_f_one_b = replay(schedule_ops(p, m), forward_time=t_f, backward_time=t_b)
        if m >= p:  # the paper's setting: bubble (p-1)(T_F + T_I - T_W) per rank
            bubble = zb_h1_bubble_time(
                p, forward_time=t_f, input_grad_time=t_i, weight_grad_time=t_w
            )
            assert timeline.makespan == pytest.approx(m * (t_f + t_b) + bubble)
        assert timeline.makespan <= one_f_one_b.makespan + 1e-12
        if p > 1:
            assert timeline.makespan < one_f_one_b.makespan
    if m >= p:
        equal = replay(plan, forward_time=1.0, backward_time=2.0, weight_fraction=0.5)
        assert equal.bubble_fraction == pytest.approx(bubble_fraction(p, m, schedule="zb_h1"))
    # same memory as 1F1B on the first stage (Section 3.1)
    assert timeline.peak_in_flight[0] == in_flight_micro_batches(p, m, schedule="zb_h1")


def test_one_f_one_b_order_on_first_and_last_stage():
    lines = str(schedule_ops(4, 6, schedule="1f1b")).splitlines()
    # 3 warm-up forwards, then one forward, one backward
    assert lines[0] == "rank 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5"
    assert lines[3] == "rank 3: 0F0 0B0 0F1 0B1 0F2 0B2 0F3 0B3 0F4 0B4 0F5 0B5"


def test_replay_respects_dependencies():
    timeline = replay(schedule_ops(3, 4, schedule="gpipe"))
    end = {(t.rank, t.action.kind, t.action.micro_batch): t.end for t in timeline.entries}
    start = {(t.rank, t.action.kind, t.action.micro_batch): t.start for t in timeline.entries}
    for mb in range(4):
        for r in (1, 2):
            assert start[(r, "F", mb)] >= end[(r - 1, "F", mb)]
        for r in (0, 1):
            assert start[(r, "B", mb)] >= end[(r + 1, "B", mb)]


def test_replay_detects_deadlock():
    bad = PipelineSchedule.parse("rank 0: 0B0 0F0\nrank 1: 0F0 0B0")
    with pytest.raises(ScheduleError, match="rank 0 waits at action 0B0"):
        replay(bad)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: bubble_fraction(0, 4), "stages must be"),
        (lambda: bubble_fraction(4, -1), "micro_batches must be"),
        (lambda: bubble_fraction(4, 8, schedule="zero_bubble"), "schedule 'zero_bubble'"),
        (lambda: bubble_fraction(4, 3, schedule="zb_h1"), "micro_batches >= stages"),
        (
            lambda: zb_h1_bubble_time(
                4, forward_time=1.0, input_grad_time=1.0, weight_grad_time=3.0
            ),
            "weight_grad_time=3.0",
        ),
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
        (lambda: PipelineSchedule(()), "at least one rank"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


NEW = [
    ("zb_h2", 1),
    ("zb_v", 2),
    ("dualpipe_v", 2),
    ("dualpipe", 2),
    ("breadth_first", 2),
    ("breadth_first", 3),
]


@pytest.mark.parametrize(("name", "v"), NEW)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (2, 8), (3, 6), (4, 8), (4, 12), (8, 16)])
def test_new_schedules_replay_to_their_closed_forms(name, v, p, m):
    """At F = I = W (backward 2 units, half of it W) each schedule's replayed bubble and
    first-rank peak equal :func:`bubble_fraction` and :func:`in_flight_micro_batches`."""
    if name == "dualpipe" and p % 2:
        return  # DualPipe needs an even p (test_pipeline_schedule names the error)
    plan = schedule_ops(p, m, schedule=name, virtual_stages=v)
    timeline = replay(plan, forward_time=1.0, backward_time=2.0, weight_fraction=0.5)
    assert timeline.bubble_fraction == pytest.approx(
        bubble_fraction(p, m, schedule=name, virtual_stages=v)
    )
    assert timeline.bubble_over_ideal == pytest.approx(
        bubble_fraction(p, m, schedule=name, virtual_stages=v, relative_to="ideal")
    )
    held = timeline.peak_in_flight[0] * plan.chunk_share
    assert held == in_flight_micro_batches(p, m, schedule=name, virtual_stages=v)


def test_new_formulas_by_hand():
    # ZB-H2 holds 2p - 1 micro-batches; ZB-V p, as 1F1B; DualPipeV p + 1/2; breadth-first m
    assert in_flight_micro_batches(4, 8, schedule="zb_h2") == 7
    assert in_flight_micro_batches(4, 8, schedule="zb_v") == 4
    assert in_flight_micro_batches(4, 8, schedule="dualpipe_v") == 4.5
    assert in_flight_micro_batches(4, 8, schedule="dualpipe") == 5  # the report's PP + 1
    assert bubble_fraction(4, 8, schedule="dualpipe") == 2 / 50
    assert in_flight_micro_batches(4, 8, schedule="breadth_first", virtual_stages=2) == 8
    # the V halves ZB-H1's synchronous bubble: (p-1)/(6m + p - 1) against (p-1)/(3m + p - 1)
    assert bubble_fraction(4, 8, schedule="zb_v") == 3 / 51
    assert bubble_fraction(4, 8, schedule="zb_h2") == bubble_fraction(4, 8, schedule="zb_h1")
    assert bubble_fraction(4, 8, schedule="breadth_first", virtual_stages=2) == 3 / 19
    # Qi et al. Table 2: ZB-H2 (p-1)(T_F + T_B - 2 T_W), zero at equal costs
    assert zb_h2_bubble_time(4, forward_time=1, input_grad_time=1, weight_grad_time=1) == 0
    assert zb_h2_bubble_time(4, forward_time=2, input_grad_time=2, weight_grad_time=1) == 6
    # DeepSeek-V3 Table 2: (PP/2 - 1)(F&B + B - 3W); F&B = F + B, F = W = 1, B = 2
    assert dualpipe_bubble_time(8, overlapped_time=3, backward_time=2, weight_grad_time=1) == 6


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: bubble_fraction(4, 6, schedule="zb_v"), r"micro_batches >= 2 \* stages - 1"),
        (lambda: in_flight_micro_batches(4, 6, schedule="dualpipe_v"), r">= 2 \* stages = 8"),
        (lambda: bubble_fraction(4, 8, schedule="zb_h2", virtual_stages=2), "looping schedule"),
        (lambda: bubble_fraction(4, 2, schedule="breadth_first"), "needs micro_batches >= stages"),
    ],
)
def test_new_schedules_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
