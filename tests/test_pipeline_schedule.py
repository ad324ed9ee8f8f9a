"""The pipeline schedule type: text form, generators, checker, and the alpha-beta replay."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from distlab.calc.pipeline import bubble_fraction
from distlab.core.pipeline_schedule import (
    GENERATORS,
    Action,
    PipelineSchedule,
    build,
    chunks_of,
    interleaved,
    with_communication,
)
from distlab.sim import Link, uniform_cluster
from distlab.sim.pipeline import p2p_seconds, simulate_pipeline
from distlab.sim.pipeline_replay import ScheduleError, check, replay

ALL = [
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved", 2),
    ("zb_h1", 1),
    ("zb_h2", 1),
    ("zb_v", 2),
    ("dualpipe_v", 2),
    ("dualpipe", 2),
    ("breadth_first", 2),
]


def test_imports_without_torch():
    code = (
        "import sys, distlab.core.pipeline_schedule, distlab.sim.pipeline_replay, "
        "distlab.calc.pipeline, distlab.sim.pipeline, distlab.viz.pipeline_plots; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("name", "v"), ALL)
def test_text_form_round_trips(name, v):
    plan = build(name, 4, 8, chunks=v)
    mapping = plan.stage_to_rank  # the text form has no mapping: V-shaped ones pass it
    both = plan.bidirectional
    assert PipelineSchedule.parse(str(plan), stage_to_rank=mapping, bidirectional=both) == plan
    lowered = with_communication(plan)
    again = PipelineSchedule.parse(
        str(lowered), chunks=v, stage_to_rank=mapping, bidirectional=both
    )
    assert again == lowered


def test_text_form_reads_by_hand():
    plan = PipelineSchedule.parse("rank 0: 0F0 0F1 0B0 0B1\nrank 1: 0F0 0B0 0F1 0B1")
    assert plan.ranks[0][2] == Action(0, "B", 0)
    assert (plan.stages, plan.micro_batches, plan.chunks) == (2, 2, 1)
    assert str(Action.parse("1SB12")) == "1SB12"
    assert check(plan).peak_in_flight == (2, 1)


@pytest.mark.parametrize("word", ["F0", "0X1", "a0F0", "0F", "-1F0"])
def test_bad_action_text(word):
    with pytest.raises(ValueError, match="cannot read action"):
        Action.parse(word)


def test_with_communication_pairs_every_send():
    lowered = with_communication(build("1f1b", 3, 4))
    assert str(lowered).splitlines()[1].startswith("rank 1: 0RF0 0F0 0SF0 0RF1 0F1 0SF1 0RB0 0B0")
    sends = sum(a.kind in ("SF", "SB") for r in lowered.ranks for a in r)
    receives = sum(a.kind in ("RF", "RB") for r in lowered.ranks for a in r)
    assert sends == receives == 2 * 2 * 4  # 2 boundaries, both directions, 4 micro-batches
    # the explicit form replays to the same timeline as the compute-only form
    assert replay(lowered).makespan == replay(build("1f1b", 3, 4)).makespan


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "rank 0: 0F0 0B0 0F1\nrank 1: 0F0 0B0 0F1 0B1",
            r"rank 0 is missing 0B1 \(or 0I1 and 0W1\)",
        ),
        ("rank 0: 0F0 0F0 0B0\nrank 1: 0F0 0B0", r"rank 0: action 0F0 appears twice"),
        ("rank 0: 0F0 0I0\nrank 1: 0F0 0B0", r"rank 0 is missing 0W0"),
        ("rank 0: 0F0 0B0 0W0\nrank 1: 0F0 0B0", r"rank 0: 0W0 after a whole backward"),
        ("rank 0: 0F0 1F0 1B0 0B0\nrank 1: 0F0 0B0", r"rank 0: action 1F0 uses chunk 1"),
        # rank 1 wants micro-batch 1 first, rank 0 waits for micro-batch 0's gradient
        (
            "rank 0: 0F0 0B0 0F1 0B1\nrank 1: 0F1 0B1 0F0 0B0",
            r"rank 0 waits at action 0B0 .*rank 1 waits at action 0F1",
        ),
        # hand-written sends: rank 0 sends micro-batch 1's activation nobody receives
        (
            "rank 0: 0F0 0SF0 0F1 0SF1 0RB0 0B0 0B1\nrank 1: 0RF0 0F0 0F1 0B0 0SB0 0B1",
            r"rank 0 waits at action 0B1|rank 1 waits at action 0F1",
        ),
        (
            "rank 0: 0F0 0SF0 0SF0 0RB0 0B0\nrank 1: 0RF0 0F0 0B0 0SB0",
            r"rank 0: action 0SF0 appears twice",
        ),
    ],
)
def test_checker_names_rank_and_action(text, match):
    with pytest.raises(ScheduleError, match=match):
        check(PipelineSchedule.parse(text, chunks=1))


def test_send_without_receive_is_named():
    plan = PipelineSchedule.parse("rank 0: 0F0 0SF0 0B0\nrank 1: 0F0 0B0")
    # rank 1 never receives (it has no RF), and rank 0's backward never gets a gradient either
    with pytest.raises(ScheduleError, match=r"rank 1 waits at action 0F0"):
        check(plan)
    plan = PipelineSchedule.parse("rank 0: 0F0 0SF0 0RB0 0B0\nrank 1: 0RF0 0F0 0SB0 0B0")
    with pytest.raises(ScheduleError, match="rank 1 waits at action 0SB0"):
        check(plan)
    plan = PipelineSchedule.parse("rank 0: 0F0 0SF0 0RB0 0B0 0SB0\nrank 1: 0RF0 0F0 0B0 0SB0")
    with pytest.raises(ScheduleError, match="rank 0: action 0SB0 talks past the first stage"):
        check(plan)


def test_bad_schedule_and_costs():
    with pytest.raises(TypeError, match=r"rank 0: '0F0' is not an Action"):
        PipelineSchedule((("0F0",),))
    plan = build("1f1b", 2, 2)
    with pytest.raises(ValueError, match=r"forward_time must be a number or 2 numbers"):
        replay(plan, forward_time=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"backward_time must be seconds >= 0"):
        replay(plan, backward_time=-1.0)
    with pytest.raises(ValueError, match="weight_fraction must be in"):
        replay(plan, weight_fraction=1.5)


def test_interleaved_needs_m_multiple_of_p():
    with pytest.raises(ValueError, match=r"micro_batches=6, stages=4 \(try micro_batches=8\)"):
        interleaved(4, 6, 2)
    with pytest.raises(ValueError, match="chunks=2 needs schedule 'interleaved'"):
        build("1f1b", 4, 8, chunks=2)
    with pytest.raises(ValueError, match="unknown schedule 'pipedream'"):
        build("pipedream", 4, 8)


def test_per_stage_costs_slowest_stage_sets_the_pace():
    # GPipe with stage costs 1, 3, 1: the middle stage runs back to back, the step is
    # (p - 1) slots of the others plus m slots of the slowest: sum(f) + (m - 1) max(f), same for b
    timeline = replay(build("gpipe", 3, 4), forward_time=[1, 3, 1], backward_time=[2, 6, 2])
    assert timeline.makespan == pytest.approx((5 + 3 * 3) + (10 + 3 * 6))


@pytest.mark.parametrize(("name", "v"), ALL)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8)])
def test_simulator_adds_alpha_beta_sends(name, v, p, m):
    link = Link("test", alpha=0.5, bandwidth=1e3)
    cluster = uniform_cluster(p, link)
    message = 500.0
    hop = p2p_seconds(cluster, 0, 1, message)
    assert hop == pytest.approx(0.5 + 500 / 1e3)
    plan = build(name, p, m, chunks=v)
    free = replay(plan)
    timed = simulate_pipeline(
        plan, cluster, message_bytes=message, forward_time=1.0, backward_time=2.0
    )
    assert timed.makespan > free.makespan
    nearly_free = simulate_pipeline(
        plan,
        uniform_cluster(p, Link("fast", 0.0, 1e18)),
        message_bytes=message,
        forward_time=1.0,
        backward_time=2.0,
    )
    assert nearly_free.makespan == pytest.approx(free.makespan)
    if name in ("gpipe", "1f1b", "interleaved"):
        kw = {"schedule": name, "virtual_stages": v}
        assert nearly_free.bubble_fraction == pytest.approx(bubble_fraction(p, m, **kw))
    if name == "gpipe":  # each direction crosses p - 1 links on the critical path
        assert timed.makespan == pytest.approx(free.makespan + 2 * (p - 1) * hop)


def test_simulator_bad_gpus():
    with pytest.raises(
        ValueError, match=r"gpu of cluster .uniform. must be an integer in 0..3, got 9"
    ):
        simulate_pipeline(
            build("1f1b", 2, 2),
            uniform_cluster(4, Link("l", 0.0, 1.0)),
            message_bytes=1,
            forward_time=1.0,
            backward_time=1.0,
            gpus=[0, 9],
        )


def test_gantt_charts_draw_every_action():
    from distlab.viz.pipeline_plots import plot_planned_and_measured, plot_timeline

    plan = build("zb_h1", 3, 4)
    planned = replay(plan)
    slower = replay(plan, forward_time=1.5, backward_time=2.5)
    fig = plot_planned_and_measured(planned, slower)
    left, right = fig.axes
    assert len(left.patches) == len(right.patches) == len(planned.entries) == 3 * 3 * 4
    assert "bubble" in right.get_title()
    assert len(plot_timeline(planned).axes[0].patches) == len(planned.entries)


def test_stage_to_rank_mapping_loop_default_v_and_bad_ones():
    from distlab.core.pipeline_schedule import stage_to_rank

    loop = interleaved(2, 4, 2)
    assert loop.stage_to_rank == (0, 1, 0, 1) and loop.placement == "loop"
    assert stage_to_rank(3, 2, "v") == (0, 1, 2, 2, 1, 0)
    v = PipelineSchedule(loop.ranks, 2, stage_to_rank=(0, 1, 1, 0))
    assert v.placement == "v" and v.virtual_stage(0, 1) == 3 and v.chunk_of(2) == 1
    assert v != loop  # same actions, another placement
    with pytest.raises(ValueError, match="gives rank 0 3 stages"):
        PipelineSchedule(loop.ranks, 2, stage_to_rank=(0, 0, 0, 1))
    with pytest.raises(ValueError, match="each of the 4 virtual stages"):
        PipelineSchedule(loop.ranks, 2, stage_to_rank=(0, 1, 2, 1))


def test_declared_micro_batches_lets_check_name_an_out_of_range_action():

    s = PipelineSchedule.parse("0F0 0F1 0B0 0B1", micro_batches=1)
    with pytest.raises(
        ScheduleError, match=r"rank 0: action 0F1 \(position 1\) uses micro-batch 1, but m=1"
    ):
        check(s)
    assert build("1f1b", 2, 3).micro_batches == 3


@pytest.mark.parametrize(("name", "v"), ALL)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 6), (4, 8), (4, 16)])
def test_every_generator_is_complete_and_deadlock_free(name, v, p, m):
    if name == "dualpipe" and p % 2:
        with pytest.raises(ValueError, match="DualPipe needs an even number of stages"):
            build(name, p, m, chunks=v)
        return
    plan = build(name, p, m, chunks=v)
    timeline = check(plan)
    assert plan.chunks == chunks_of(name, v) and plan.micro_batches == m
    kinds = {a.kind for row in plan.ranks for a in row}
    assert kinds <= {"F", "B", "I", "W"}
    assert len(timeline.entries) == sum(len(row) for row in plan.ranks)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 6), (4, 8), (4, 12)])
def test_zb_h2_ranks_never_wait_once_started(p, m):
    """Qi et al.'s parallelogram: at F = I = W no rank idles between its first and last
    action, so overlapping steps leave no bubble; rank r warms up with 2(p - r) - 1."""
    timeline = replay(build("zb_h2", p, m), forward_time=1.0, backward_time=2.0)
    assert timeline.span_bubble_fraction == 0
    assert [start for start, _ in timeline.spans] == list(range(p))
    assert timeline.peak_in_flight == tuple(min(2 * (p - r) - 1, m) for r in range(p))
    zb_h1 = replay(build("zb_h1", p, m), forward_time=1.0, backward_time=2.0)
    assert zb_h1.span_bubble_fraction > 0  # its first rank waits for the first gradient
    assert timeline.makespan == zb_h1.makespan  # one synchronous step: the same


@pytest.mark.parametrize("name", ["zb_v", "dualpipe_v"])
def test_v_shaped_schedules_hold_two_chunks_in_a_v(name):
    plan = build(name, 4, 8)
    assert plan.placement == "v" and plan.chunks == 2
    assert [plan.virtual_stage(r, 1) for r in range(4)] == [7, 6, 5, 4]
    # the turn of the V (stages 3 and 4 on rank 3) needs no message: replay hands it over
    lowered = with_communication(plan)
    assert Action(0, "SF", 0) in lowered.ranks[3] and Action(1, "RF", 0) in lowered.ranks[3]
    assert replay(lowered).makespan == replay(plan).makespan


_TORCH_KIND = {"FORWARD": "F", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


def _torch_zb_v_order(p: int, m: int, rank: int) -> list[tuple[int, str, int]]:
    """(chunk, kind, micro-batch) of rank ``rank`` in torch's ScheduleZBVZeroBubble, from the
    method that computes it (it reads only these three attributes)."""
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    fake = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    actions = ScheduleZBVZeroBubble._calculate_single_rank_operations(fake, rank)
    return [
        (
            0 if a.stage_index == rank else 1,
            _TORCH_KIND[a.computation_type.name],
            a.microbatch_index,
        )
        for a in actions
        if a is not None
    ]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_zb_v_is_torchs_order_for_any_number_of_micro_batches(p):
    """Issue 39: zb_v refused p = 4, m = 4, which torch builds. With m < 2p - 1 it is the
    order for 2p - 1 without the missing micro-batches, as torch's; it still runs."""
    for m in range(1, 2 * p + 4):
        plan = build("zb_v", p, m)
        for r in range(p):
            mine = [(a.chunk, a.kind, a.micro_batch) for a in plan.ranks[r]]
            assert mine == _torch_zb_v_order(p, m, r), (p, m, r)
        check(plan)  # complete and deadlock-free
        check(with_communication(plan))


def _torch_dualpipe_v_order(p: int, m: int, rank: int) -> list[tuple[int, str, int]]:
    """Rank ``rank``'s order in torch's ScheduleDualPipeV, each overlapped forward-backward
    pair (OVERLAP_F_B) written as its forward, then its backward."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    kinds = {**_TORCH_KIND, "FULL_BACKWARD": "B"}

    def flat(a):
        if a.computation_type.name == "OVERLAP_F_B":
            return [x for sub in a.sub_actions for x in flat(sub)]
        return [
            (0 if a.stage_index == rank else 1, kinds[a.computation_type.name], a.microbatch_index)
        ]

    fake = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    actions = ScheduleDualPipeV._calculate_single_rank_operations(fake, rank)
    return [x for a in actions if a is not None for x in flat(a)]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_dualpipe_v_is_torchs_order(p):
    """distlab's DualPipeV runs torch's ScheduleDualPipeV's order (overlapped pairs one after
    the other) and, as torch, needs m >= 2p."""
    for m in range(2 * p, 2 * p + 5):
        plan = build("dualpipe_v", p, m)
        for r in range(p):
            mine = [(a.chunk, a.kind, a.micro_batch) for a in plan.ranks[r]]
            assert mine == _torch_dualpipe_v_order(p, m, r), (p, m, r)


def test_new_schedules_name_what_they_cannot_do():
    with pytest.raises(ValueError, match=r"ZB-V needs micro_batches >= 2 \* stages - 1 = 7"):
        bubble_fraction(4, 6, schedule="zb_v")  # the closed form; build("zb_v", 4, 6) runs
    with pytest.raises(ValueError, match=r"DualPipeV needs micro_batches >= 2 \* stages = 8"):
        build("dualpipe_v", 4, 7)
    with pytest.raises(
        ValueError, match="chunks=3 needs schedule 'interleaved' or 'breadth_first'"
    ):
        build("zb_v", 4, 8, chunks=3)
    assert chunks_of("zb_v") == chunks_of("dualpipe_v", 2) == 2
    assert chunks_of("breadth_first", 3) == 3 and chunks_of("zb_h2") == 1
    with pytest.raises(ValueError, match="unknown schedule 'dual_pipe'"):
        chunks_of("dual_pipe")
    with pytest.raises(ValueError, match="DualPipe needs an even number of stages"):
        build("dualpipe", 4, 6)


def test_layout_accepts_every_generated_schedule():
    from distlab.core.layout import Layout

    for name in GENERATORS:
        assert Layout(pp=4, schedule=name, micro_batches=8).pipeline_schedule == name


def test_dualpipe_runs_two_pipelines_one_each_way():
    """DeepSeek-V3's DualPipe: micro-batches 0..m/2-1 go down ranks 0..p-1 (stages 0..p-1),
    the others up ranks p-1..0 (stages p..2p-1); stage j runs model part j mod p, so rank r
    holds parts r and p - 1 - r; each chunk is a whole stage of one copy."""
    plan = build("dualpipe", 4, 8)
    assert plan.bidirectional and plan.placement == "v" and plan.chunk_share == 1
    assert plan.route(3) == (0, 3) and plan.route(4) == (4, 7)
    assert [plan.model_part(plan.virtual_stage(1, c)) for c in range(2)] == [1, 2]
    assert {a.micro_batch for a in plan.ranks[0] if a.chunk == 0} == set(range(4))
    assert {a.micro_batch for a in plan.ranks[0] if a.chunk == 1} == set(range(4, 8))
    lowered = with_communication(plan)
    assert Action(0, "SF", 0) not in lowered.ranks[3]  # stage 3 ends micro-batch 0's route
    assert Action(1, "RF", 4) not in lowered.ranks[3]  # stage 4 starts micro-batch 4's
    timeline = replay(plan, forward_time=1, backward_time=2)
    assert timeline.makespan == replay(lowered, forward_time=1, backward_time=2).makespan
    # a chunk that runs a micro-batch outside its route is named
    wrong = PipelineSchedule(
        ((Action(0, "F", 4),),) + plan.ranks[1:], 2, micro_batches=8,
        stage_to_rank=plan.stage_to_rank, bidirectional=True,
    )  # fmt: skip
    with pytest.raises(ScheduleError, match="micro-batch 4 goes through stages 4..7 only"):
        check(wrong)
    with pytest.raises(ValueError, match="needs an even number of virtual stages and of"):
        PipelineSchedule(
            plan.ranks, 2, micro_batches=7, stage_to_rank=plan.stage_to_rank, bidirectional=True
        )


def test_bidirectional_names_the_schedules_that_run_two_copies():
    """core.pipeline_schedule.BIDIRECTIONAL (what parallelize cuts in p parts) is exactly
    the generators whose schedules say ``bidirectional``."""
    from distlab.core.pipeline_schedule import BIDIRECTIONAL, GENERATORS, LOOPING, build

    for name in GENERATORS:
        schedule = build(name, 2, 4, chunks=2 if name in LOOPING else 1)
        assert schedule.bidirectional == (name in BIDIRECTIONAL), name
