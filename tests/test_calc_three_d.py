"""distlab.calc.three_d's helpers take one Layout.

The numbers are the old tp/pp/dp signature's (the ``OLD_*`` tables below were printed by
the helpers before they took a Layout, with the same model, degrees and settings), each
layout field they do not model is refused by name, and a layout's ``order`` decides which
ranks are on which stage and which links the groups get. Without processes or torch.
"""

from __future__ import annotations

import re

import pytest

from distlab.calc.planner import PlannerAssumptions
from distlab.calc.three_d import (
    check_three_d_layout,
    gpt_spec,
    job_comm_totals,
    layout_step_time,
    rank_volumes,
    three_d_comm,
)
from distlab.calc.transformer import model_preset
from distlab.core.layout import Layout
from distlab.sim.topology import preset

SPEC = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
NVLINK, IB = "NVLink4 (H100, via NVSwitch)", "InfiniBand NDR 400 Gb/s"

# Since compose.train all-reduces a step's gradients as one flat buffer (not one tensor at
# a time), the "dp" entries with zero_stage=0 differ from the old helper's in the number of
# messages only, never in bytes: 1 part, not 7 per size (the second stage's other part is
# the tied embedding's), 12 all-reduces in the job, not 280 (8 ranks' gradients and 4 loss
# averages), and in OLD_STEP_TIMES each dp time fell by exactly the dropped messages' alpha
# (7B on DP8: 290 fewer all-reduces x 2 (p - 1) = 14 messages x 2 us = 8.12 ms).
# The old helper's results: three_d_comm(SPEC, tp=, pp=, dp=, micro_batch=, micro_batches=,
# stage=, bytes_per_element=, zero_stage=, chunks=, layer_buffers=) per stage, as
# {group: (total bytes, parts)}; the layout holds what were tp, pp, dp, micro_batch,
# micro_batches, zero_stage and chunks (virtual_stages).
OLD_COMM = [
    (
        Layout(tp=2, pp=2, dp=2, micro_batch=2, micro_batches=2),
        {"bytes_per_element": 4},
        [
            {"tp": (36864, 3), "pp": (4096, 1), "embedding": (3968, 1), "dp": (56576, 1)},
            {"tp": (37120, 5), "pp": (4096, 1), "embedding": (3968, 1), "dp": (55816, 2)},
        ],
    ),
    (
        Layout(tp=2, pp=2, dp=2, micro_batch=1, micro_batches=2, zero_stage=1, virtual_stages=2),
        {"bytes_per_element": 4, "layer_buffers": (64,)},
        [
            {"tp": (18432, 3), "pp": (6144, 2), "embedding": (3968, 1), "dp": (85120, 9)},
            {"tp": (18560, 5), "pp": (6144, 2), "embedding": (3968, 1), "dp": (83976, 9)},
        ],
    ),
    (
        Layout(tp=1, pp=4, dp=2, micro_batch=1, micro_batches=4, zero_stage=1),
        {},  # the default 2 bytes per element
        [
            {"tp": (0, 0), "pp": (2048, 1), "embedding": (3968, 1), "dp": (44832, 8)},
            {"tp": (0, 0), "pp": (4096, 2), "embedding": (0, 0), "dp": (38112, 6)},
            {"tp": (0, 0), "pp": (4096, 2), "embedding": (0, 0), "dp": (38112, 6)},
            {"tp": (0, 0), "pp": (2048, 1), "embedding": (3968, 1), "dp": (44264, 8)},
        ],
    ),
]

# The old helper's results: job_comm_totals(rank_volumes(...)) of the first two layouts
# above, {(group, collective): (calls, payload bytes, wire bytes)}.
OLD_TOTALS = [
    {
        ("dp", "all_reduce"): (12, 449568, 449568),
        ("embedding", "recv"): (8, 31744, 0),
        ("embedding", "send"): (8, 31744, 31744),
        ("pp", "recv"): (16, 32768, 0),
        ("pp", "send"): (16, 32768, 32768),
        ("tp", "all_gather"): (8, 1024, 512),
        ("tp", "all_reduce"): (152, 295424, 295424),
    },
    {
        ("dp", "all_gather"): (8, 449536, 224768),
        ("dp", "all_reduce"): (4, 32, 32),
        ("dp", "broadcast"): (292, 453632, 226816),
        ("dp", "reduce_scatter"): (8, 449536, 224768),
        ("embedding", "recv"): (8, 31744, 0),
        ("embedding", "send"): (8, 31744, 31744),
        ("pp", "recv"): (48, 49152, 0),
        ("pp", "send"): (48, 49152, 49152),
        ("tp", "all_gather"): (8, 512, 256),
        ("tp", "all_reduce"): (152, 147712, 147712),
    },
]

# The old helper's results: layout_step_time(spec, cluster, tp=, pp=, dp=, micro_batch=,
# micro_batches=), which priced sequence_parallel=(tp > 1) in the planner: per-group
# seconds (tp, pp, dp, embedding), their links, fits, and the planner's step_s.
TINY = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
FP32 = PlannerAssumptions(recipe="fp32_adam")
OLD_STEP_TIMES = [
    (
        "7B", 1, Layout(tp=2, pp=2, dp=2, micro_batch=1, micro_batches=8), None,
        (0.04090259285333333, 0.0006125232355555555, 0.007495433404444444, 0.0),
        (NVLINK, NVLINK, NVLINK, NVLINK), False, 0.9270232910778743,
    ),
    (
        "7B", 1, Layout(tp=4, pp=2, dp=1, micro_batch=2, micro_batches=4), None,
        (0.06135432618666667, 0.0006045232355555556, 0.0, 0.0),
        (NVLINK, NVLINK, "-", NVLINK), True, 0.5611330602975845,
    ),
    (
        "7B", 1, Layout(dp=8), None,
        (0.0, 0.0, 0.052465899266666664, 0.0),
        ("-", "-", NVLINK, "-"), False, 0.44067585524251207,
    ),
    (
        "7B", 2, Layout(tp=2, pp=4, dp=2, micro_batch=1, micro_batches=8), None,
        (0.020789849315555557, 0.01081741824, 0.0038973613688888893, 0.0),
        (NVLINK, IB, NVLINK, IB), True, 0.5727437511451208,
    ),
    (
        "tiny", 1, Layout(tp=2, pp=2, dp=2, micro_batch=2, micro_batches=2), FP32,
        (5.2046079999999995e-05, 4.009102222222222e-06, 4.068408888888889e-06,
         2.0088177777777776e-06),
        (NVLINK, NVLINK, NVLINK, NVLINK), True, 6.409989956364453e-05,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("layout", "options", "stages"), OLD_COMM)
def test_three_d_comm_of_a_layout_is_the_old_count(layout, options, stages):
    for stage, want in enumerate(stages):
        volumes = three_d_comm(SPEC, layout, stage=stage, **options)
        got = {group: (volume.total, len(volume.parts)) for group, volume in volumes.items()}
        assert got == want, (layout.label(), stage)


@pytest.mark.parametrize(("case", "want"), list(zip(OLD_COMM, OLD_TOTALS)))
def test_job_totals_of_a_layout_are_the_old_ones(case, want):
    layout, options, _ = case
    totals = job_comm_totals(rank_volumes(SPEC, layout, **options))
    got = {key: (t.calls, t.payload_bytes, t.wire_bytes) for key, t in totals.items()}
    assert got == want


@pytest.mark.parametrize(
    ("model", "nodes", "layout", "assumptions", "seconds", "links", "fits", "step_s"),
    OLD_STEP_TIMES,
)
def test_layout_step_time_of_a_layout_is_the_old_estimate(
    model, nodes, layout, assumptions, seconds, links, fits, step_s
):
    spec = model_preset(model) if model == "7B" else TINY
    megatron = layout.with_(sequence_parallel=layout.tp > 1)  # what the old helper priced
    lt = layout_step_time(spec, preset("dgx-h100", nodes=nodes), megatron, assumptions=assumptions)
    groups = ("tp", "pp", "dp", "embedding")
    assert lt.estimate.layout == megatron
    assert tuple(lt.group_seconds[g] for g in groups) == pytest.approx(seconds, rel=1e-12)
    assert tuple(lt.group_links[g] for g in groups) == links
    assert (lt.fits, lt.estimate.step_s) == (fits, pytest.approx(step_s, rel=1e-12))


def test_layout_step_time_simulates_train_3d_with_or_without_sequence_parallel():
    """The planner prices the layout as given; the simulated traffic is train_3d's run."""
    cluster = preset("dgx-h100", nodes=1)
    layout = Layout(tp=2, pp=2, dp=2, micro_batches=8)
    plain = layout_step_time(model_preset("7B"), cluster, layout)
    sp = layout_step_time(model_preset("7B"), cluster, layout.with_(sequence_parallel=True))
    assert plain.group_seconds == sp.group_seconds
    assert plain.estimate != sp.estimate


BASE = Layout(pp=2, dp=2, micro_batches=2)
REFUSED = [  # (what the layout sets, the field the ValueError must name)
    ({"cp": 2}, "cp=2"),
    ({"ep": 2}, "ep=2"),
    ({"zero_stage": 2}, "zero_stage=2"),
    ({"zero_stage": 3}, "zero_stage=3"),
    ({"tp": 2, "sequence_parallel": True}, "sequence_parallel=True"),
    ({"recompute": "full"}, "recompute='full'"),
    ({"recompute": "selective"}, "recompute='selective'"),
]


@pytest.mark.parametrize(("changes", "field"), REFUSED)
def test_what_train_3d_cannot_set_is_refused_by_name(changes, field):
    layout = BASE.with_(**changes)
    with pytest.raises(ValueError, match=re.escape(field)):
        three_d_comm(SPEC, layout, stage=0)
    with pytest.raises(ValueError, match=re.escape(field)):
        rank_volumes(SPEC, layout)
    with pytest.raises(ValueError, match=re.escape(field)):
        check_three_d_layout(layout)


@pytest.mark.parametrize(
    ("changes", "field"),
    [r for r in REFUSED if "sequence_parallel" not in r[0]] + [({"zero_stage": 1}, "zero_stage=1")],
)
def test_layout_step_time_refuses_by_name_what_it_does_not_model(changes, field):
    cluster = preset("dgx-h100", nodes=1)
    with pytest.raises(ValueError, match=re.escape(field)):
        layout_step_time(model_preset("7B"), cluster, BASE.with_(**changes))


def test_a_layout_is_required():
    cluster = preset("dgx-h100", nodes=1)
    for call in (
        lambda: three_d_comm(SPEC, {"tp": 2, "pp": 2, "dp": 2}, stage=0),
        lambda: rank_volumes(SPEC, (2, 2, 2)),
        lambda: layout_step_time(model_preset("7B"), cluster, None),
    ):
        with pytest.raises(TypeError, match="layout must be a distlab.core.layout.Layout"):
            call()


def test_a_layouts_order_decides_each_ranks_stage_and_each_groups_link():
    layout = Layout(tp=2, pp=2, dp=2, micro_batch=2, micro_batches=2, order="pp-tp-cp-ep-dp")
    volumes = rank_volumes(SPEC, layout, bytes_per_element=4)
    stages = [layout.coordinates(rank)["pp"] for rank in range(layout.world_size)]
    assert stages != [rank // 4 for rank in range(8)]  # not the default numbering
    for rank, stage in enumerate(stages):
        assert volumes[rank] == three_d_comm(SPEC, layout, stage=stage, bytes_per_element=4)
    default = rank_volumes(SPEC, layout.with_(order="tp-cp-ep-dp-pp"), bytes_per_element=4)
    assert job_comm_totals(volumes) == job_comm_totals(default)
    # on 2 nodes, dp outermost puts each pipeline inside a node and dp across the two
    two = preset("dgx-h100", nodes=2)
    pp_inside = Layout(tp=2, pp=4, dp=2, micro_batches=8, order="tp-cp-ep-pp-dp")
    lt = layout_step_time(model_preset("7B"), two, pp_inside)
    links = lt.group_links
    assert (links["tp"], links["pp"], links["embedding"], links["dp"]) == (
        NVLINK,
        NVLINK,
        NVLINK,
        IB,
    )
