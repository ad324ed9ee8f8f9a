"""Pipeline schedules exchanged with torch.distributed.pipelining: round trips,
torch's schedules checked and replayed by distlab, per-rank orders compared."""

from __future__ import annotations

import pytest

from distlab.parallel.pipeline import (
    PipelineSchedule,
    ScheduleError,
    build,
    check,
    from_torch,
    gpipe,
    interleaved,
    one_f_one_b,
    read_csv,
    replay,
    stage_to_rank,
    to_torch,
    torch_schedule,
    with_communication,
    write_csv,
    zb_h1,
)

S = pytest.importorskip("torch.distributed.pipelining.schedules")

GRID = [(p, m, v) for p in (2, 4) for m in (4, 8) for v in (1, 2)]
TORCH_MULTI = ["ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"]


def _distlab_schedules(p, m, v):
    names = ["interleaved"] if v == 2 else ["gpipe", "1f1b", "interleaved", "zb_h1"]
    return [build(name, p, m, chunks=v) for name in names]


@pytest.mark.parametrize("p,m,v", GRID)
def test_round_trip_through_torch_actions_gives_the_same_schedule(p, m, v):
    for schedule in _distlab_schedules(p, m, v):
        exported = to_torch(schedule)
        assert all(isinstance(a, S._Action) for row in exported.values() for a in row)
        # torch's own validator accepts the export and finds the same stage-to-rank mapping
        mapping = S._validate_schedule(exported, p, p * v, m)
        assert tuple(mapping[j] for j in range(p * v)) == schedule.stage_to_rank
        assert from_torch(exported) == schedule, schedule.name
        spelled = with_communication(schedule)
        assert from_torch(to_torch(spelled)) == spelled


def test_export_uses_the_virtual_stage_as_torch_stage_index():
    exported = to_torch(interleaved(2, 4, 2))
    assert [str(a) for a in exported[1][:4]] == ["1F0", "1F1", "3F0", "3B0"]
    assert str(to_torch(zb_h1(2, 4))[1][1]) == "1I0"


def test_csv_matches_torchs_own_dump_and_load(tmp_path):
    zbv = torch_schedule("ScheduleZBVZeroBubble", 4, 8, 2)
    torch_file = tmp_path / "torch.csv"
    S.PipelineScheduleMulti._dump_csv(zbv, torch_file)
    ours = read_csv(torch_file, micro_batches=8)
    assert ours == from_torch(zbv)
    assert ours.placement == "v"
    # what we write, torch reads back to the same action lists
    our_file = tmp_path / "ours.csv"
    write_csv(ours, our_file)
    reloaded = torch_schedule("ScheduleInterleaved1F1B", 4, 8, 2)
    S.PipelineScheduleMulti._load_csv(reloaded, our_file)
    assert reloaded.stage_index_to_group_rank == zbv.stage_index_to_group_rank
    drop_idle = {r: [a for a in row if a is not None] for r, row in zbv.pipeline_order.items()}
    assert reloaded.pipeline_order == drop_idle


TORCH_CASES = [(name, p, m, v) for name in TORCH_MULTI for p, m, v in GRID]
TORCH_CASES += [("ScheduleZBVZeroBubble", p, m, 2) for p, m, v in GRID if v == 2]  # 2 stages/rank
TORCH_CASES += [("ScheduleGPipe", p, m, 1) for p, m, v in GRID if v == 1]


@pytest.mark.parametrize("name,p,m,v", TORCH_CASES)
def test_torchs_schedules_pass_distlabs_check(name, p, m, v):
    schedule = from_torch(torch_schedule(name, p, m, v))
    assert (schedule.stages, schedule.chunks, schedule.micro_batches) == (p, v, m)
    check(schedule)
    if name != "ScheduleGPipe":
        # torch's lowering with its sends and receives spelled out passes too
        t = torch_schedule(name, p, m, v)
        lowered = from_torch(
            t.pipeline_order_with_comms, micro_batches=m, stage_to_rank=t.stage_index_to_group_rank
        )
        assert any(a.kind == "RF" for row in lowered.ranks for a in row)
        check(lowered)


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8)])
def test_torchs_listed_1f1b_order_is_invalid_and_check_names_the_action(p, m):
    """Schedule1F1B.pipeline_order starts the last rank at F1 and ends it with F_m."""
    listed = from_torch(torch_schedule("Schedule1F1B", p, m))
    last = listed.ranks[p - 1]
    assert str(last[0]) == "0F1" and f"0F{m}" in map(str, last)
    with pytest.raises(ScheduleError) as error:
        check(listed)
    position = [str(a) for a in last].index(f"0F{m}")
    assert str(error.value) == (
        f"rank {p - 1}: action 0F{m} (position {position}) uses micro-batch {m}, "
        f"but m={m} (micro-batches 0..{m - 1})"
    )


def _torch_executed_1f1b(p, m):
    """The order Schedule1F1B._step_microbatches runs on each rank: min(m, p - r)
    warm-up forwards, then one backward and one forward in turn, then the backwards."""
    ranks = []
    for r in range(p):
        warmup = min(m, p - r)
        row = [f"0F{i}" for i in range(warmup)]
        for k in range(m):
            row.append(f"0B{k}")
            if warmup + k < m:
                row.append(f"0F{warmup + k}")
        ranks.append(" ".join(row))
    return PipelineSchedule.parse("\n".join(ranks), micro_batches=m)


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8)])
def test_gpipe_executed_1f1b_and_zb_h1_agree_with_torch_rank_for_rank(p, m):
    assert from_torch(torch_schedule("ScheduleGPipe", p, m)).ranks == gpipe(p, m).ranks
    assert _torch_executed_1f1b(p, m).ranks == one_f_one_b(p, m).ranks
    zb = from_torch(torch_schedule("ScheduleInterleavedZeroBubble", p, m, 1))
    assert zb.ranks == zb_h1(p, m).ranks


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8)])
def test_interleaved_agrees_with_torch_except_when_m_equals_p(p, m):
    ours, torchs = interleaved(p, m, 2), from_torch(torch_schedule(TORCH_MULTI[0], p, m, 2))
    if m != p:
        assert ours.ranks == torchs.ranks
        return
    # m = p: distlab runs every forward first (Megatron-LM), torch warms up rank by rank
    assert ours.ranks != torchs.ranks
    assert all(a.kind == "F" for row in ours.ranks for a in row[: 2 * m])
    assert check(ours).peak_in_flight == (8, 8, 8, 8)
    assert check(torchs).peak_in_flight == (8, 8, 7, 5)
    assert replay(ours).makespan == replay(torchs).makespan


def test_v_shaped_schedule_replays_with_a_small_bubble():
    zbv = from_torch(torch_schedule("ScheduleZBVZeroBubble", 4, 8, 2))
    assert zbv.stage_to_rank == stage_to_rank(4, 2, "v") == (0, 1, 2, 3, 3, 2, 1, 0)
    assert zbv.virtual_stage(0, 1) == 7 and zbv.chunk_of(4) == 1 and zbv.rank_of(4) == 3
    # F = I = W: ZB-V's assumption (backward_time 2 split half and half)
    timeline = replay(zbv, forward_time=1.0, backward_time=2.0, weight_fraction=0.5)
    one_f = replay(one_f_one_b(4, 8), forward_time=1.0, backward_time=2.0)
    assert 0 < timeline.bubble_fraction < one_f.bubble_fraction / 3
    assert timeline.bubble_fraction == pytest.approx(1 / 17)
    # the same actions read loop-around deadlock: the mapping is what makes it valid
    loop = PipelineSchedule(zbv.ranks, 2, micro_batches=8)
    with pytest.raises(ScheduleError, match="deadlocks"):
        check(loop)


def test_from_torch_names_an_action_on_the_wrong_rank():
    order = to_torch(one_f_one_b(2, 2))
    with pytest.raises(ValueError, match=r"rank 0: action 0F0 runs stage 0, .* gives to rank 1"):
        from_torch(order, stage_to_rank={0: 1, 1: 0})


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 12)])
@pytest.mark.parametrize(
    "name,torch_class", [("zb_v", "ScheduleZBVZeroBubble"), ("dualpipe_v", "ScheduleDualPipeV")]
)
def test_v_shaped_generators_agree_with_torch_rank_for_rank(name, torch_class, p, m):
    """distlab writes ZB-V and DualPipeV from the papers' phases; torch's lists (its
    overlapped forward-backward split into its two actions) are the same."""
    ours = build(name, p, m)
    theirs = from_torch(torch_schedule(torch_class, p, m, 2), micro_batches=m)
    assert theirs.stage_to_rank == ours.stage_to_rank == stage_to_rank(p, 2, "v")
    compute = tuple(tuple(a for a in row if a.kind in "FBIW") for row in theirs.ranks)
    assert compute == ours.ranks


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_breadth_first_agrees_with_torch_up_to_the_backward_order(p, m):
    """torch's LoopedBFS runs each chunk's backwards last micro-batch first; distlab's in
    micro-batch order (as GPipe). Same forwards, same makespan, same memory."""
    ours = build("breadth_first", p, m, chunks=2)
    theirs = from_torch(torch_schedule("ScheduleLoopedBFS", p, m, 2), micro_batches=m)
    for mine, torchs in zip(ours.ranks, theirs.ranks):
        assert mine[: 2 * m] == torchs[: 2 * m]
        assert sorted(mine[2 * m :]) == sorted(torchs[2 * m :])
    assert replay(ours).makespan == replay(theirs).makespan
    assert check(ours).peak_in_flight == check(theirs).peak_in_flight
