"""Tracing one 3D step: every group's collectives equal distlab.calc's prediction.

One launch of TP=2 x PP=2 x DP=2 (8 gloo processes) runs one ``train_3d``
step inside ``trace_comm`` (1F1B, gradients all-reduced over dp); a second
launch runs one step with ZeRO-1 and one with ZeRO-1 and the interleaved
schedule (v = 2 chunks, a 4-layer GPT) and builds ZeroOptimizers with small
buckets. Every (group, collective) the calculator models must match in calls,
payload bytes and wire bytes, summed over the job and on each rank (with
groups of 2 ranks the ring's per-rank formula is exact; ZeRO's one-time
broadcast only summed); the only unmodelled rows are the pipeline executor's
64-byte shape headers. A prediction for the wrong configuration (ZeRO off,
or 1F1B's sends) must not match.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import distlab
from distlab.calc.buckets import zero_flat_groups
from distlab.calc.moe import moe_all_to_all_comm
from distlab.calc.planner import evaluate, plan
from distlab.calc.three_d import (
    gpt_spec,
    job_comm_totals,
    layout_step_time,
    rank_volumes,
    three_d_comm,
)
from distlab.calc.transformer import model_preset, rank_parameter_tensors
from distlab.core.layout import Layout
from distlab.core.pipeline_schedule import build, with_communication
from distlab.models import GPT, GPTConfig
from distlab.parallel.comm.buckets import assign_buckets, bucket_cap_bytes, trainable_parameters
from distlab.parallel.zero.flat import FlatGroup
from distlab.sim.topology import preset

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
TP, PP, DP, M, BATCH = 2, 2, 2, 2, 8
LAYOUT = Layout(tp=TP, pp=PP, dp=DP, micro_batches=M, micro_batch=BATCH // (DP * M))


@pytest.fixture(scope="module")
def calls():
    from distlab.parallel.compose.traffic import _traced_step

    return distlab.run(_traced_step, 8, args=(CONFIG, TP, PP, DP, BATCH, M), timeout=180)


def _predicted():
    from distlab.parallel.compose.traffic import predicted_three_d

    return predicted_three_d(CONFIG, tp=TP, pp=PP, dp=DP, batch=BATCH, micro_batches=M)


def test_every_modelled_row_matches_the_calculator(calls):
    from distlab.parallel.compose.traffic import format_trace_table, trace_table

    rows = trace_table([c for r in calls for c in r], _predicted())
    table = format_trace_table(rows)
    assert {(r.group, r.collective) for r in rows if r.predicted is not None} == {
        ("tp", "all_reduce"), ("tp", "all_gather"), ("pp", "send"), ("pp", "recv"),
        ("embedding", "send"), ("embedding", "recv"), ("dp", "all_reduce"),
    }  # fmt: skip
    assert all(r.match for r in rows if r.predicted is not None), table
    unmodelled = [r for r in rows if r.predicted is None]
    assert {(r.group, r.collective) for r in unmodelled} == {
        ("pp", "send header"),
        ("pp", "recv header"),
    }
    for r in unmodelled:  # one 8 x int64 header per pipeline message
        assert r.payload_bytes == 64 * r.calls == 64 * 2 * M * DP * TP


def test_each_rank_sends_what_three_d_comm_predicts_for_its_stage(calls):
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
    for rank, rank_calls in enumerate(calls):
        stage = rank // (TP * DP)
        want = three_d_comm(spec, LAYOUT, stage=stage, bytes_per_element=4)
        for group, volume in want.items():
            sent = sum(
                c.wire_bytes
                for c in rank_calls
                if c.group == group and "header" not in c.collective
            )
            assert sent == volume.total, (rank, group)


def test_dropping_or_doubling_one_call_breaks_the_match(calls):
    from distlab.parallel.compose.traffic import trace_table

    flat = [c for r in calls for c in r]
    for i in (0, len(flat) // 2, len(flat) - 1):
        for changed in (flat[:i] + flat[i + 1 :], flat + [flat[i]]):
            rows = trace_table(changed, _predicted())
            assert not all(r.match for r in rows if r.predicted is not None), i


def test_the_prediction_breaks_when_the_model_is_wrong():
    predicted = _predicted()
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=2, tie_embeddings=False)
    untied = job_comm_totals(rank_volumes(spec, LAYOUT, bytes_per_element=4))
    assert ("embedding", "send") not in untied
    assert untied[("dp", "all_reduce")].calls == predicted[("dp", "all_reduce")].calls


def test_rank_parameter_tensors_cover_the_model():
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
    one = rank_parameter_tensors(spec)
    assert sum(one) == spec.n_params and len(one) == 2 * 16 + 2 + 2
    t, h, L, s, v = 2, 32, 2, 8, 62
    total = sum(sum(rank_parameter_tensors(spec, tp=t, pp=2, stage=st)) for st in range(2)) * t
    replicated = L * 6 * h + s * h + 2 * h  # LayerNorms, proj and fc2 biases, positions, ln_f
    rows = -(-v // t) * t  # vocabulary padded to a multiple of t
    tied_copy = rows * h  # the last stage's copy of the embedding
    assert total == spec.n_params + (t - 1) * replicated + (rows - v) * h + tied_copy
    llama = model_preset("7B")
    assert sum(rank_parameter_tensors(llama)) == llama.n_params
    with pytest.raises(ValueError, match="stage"):
        rank_parameter_tensors(spec, pp=2, stage=2)
    with pytest.raises(ValueError, match="tp=3"):
        rank_parameter_tensors(spec, tp=3)


def test_evaluate_is_what_plan_computes_for_that_layout():
    cluster = preset("dgx-h100", nodes=1)
    found = plan("7B", cluster, global_batch=16).candidates
    layout = found[0].layout
    assert evaluate("7B", cluster, layout) == found[0]
    with pytest.raises(ValueError, match="GPUs"):
        evaluate("7B", cluster, layout.with_(dp=layout.dp * 2))
    megatron = Layout(tp=2, pp=2, dp=2, micro_batches=8, sequence_parallel=True)
    lt = layout_step_time(model_preset("7B"), cluster, megatron)
    assert lt.estimate.layout == megatron
    assert lt.group_seconds["embedding"] == 0  # LLaMA's output layer is not tied
    assert lt.group_seconds["tp"] > lt.group_seconds["dp"] > lt.group_seconds["pp"] > 0


def test_count_traffic_nests():
    from distlab.collectives.traffic import Traffic, count_traffic

    with count_traffic() as outer:
        outer.bytes_sent = 5
        with count_traffic() as inner:
            inner.add(Traffic(7, 1, {"ring_all_reduce": 7}))
    assert (outer.bytes_sent, outer.messages, outer.by_schedule) == (12, 1, {"ring_all_reduce": 7})


def test_no_trace_costs_nothing():
    from distlab.parallel.comm.trace import _IDLE, traced

    assert traced("all_reduce", None, torch.zeros(1)) is _IDLE


def _moe_step(rank, world_size):
    from distlab.parallel.comm.trace import trace_comm
    from distlab.parallel.moe.layer import ExpertParallelMoE, MoE

    dense = MoE(8, 16, 4, top_k=1, capacity_factor=1.0)
    layer = ExpertParallelMoE.from_dense(dense)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    with trace_comm() as trace:
        layer(x).sum().backward()
    return trace.calls


def test_moe_all_to_all_is_traced_as_ep():
    calls = distlab.run(_moe_step, 2, timeout=60)
    want = moe_all_to_all_comm(tokens=16, hidden=8, num_experts=4, ep=2, capacity_factor=1.0,
                               bytes_per_element=4)  # fmt: skip
    for rank_calls in calls:
        assert {(c.group, c.collective) for c in rank_calls} == {("ep", "all_to_all")}
        assert len(rank_calls) == len(want.parts)
        assert sum(c.wire_bytes for c in rank_calls) == want.total


# ------------------------------------------------ ZeRO-1 and the interleaved schedule ---
# One 8-process launch traces one step of each option set on a 4-layer GPT (the
# interleaved schedule with v = 2 needs pp * v = 4 | layers), and builds
# ZeroOptimizers with small buckets to compare their flat groups with the calculator.
CONFIG4 = dataclasses.replace(CONFIG, layers=4)
OPTIONS = {
    "zero1": {"zero_stage": 1},
    "interleaved": {"zero_stage": 1, "schedule": "interleaved", "chunks": 2},
}
SMALL_BUCKETS_MB = (0.01, 0.05)  # 10 and 51 KiB: several flat groups per rank


def _flat_group_sizes(mesh, chunks: int, bucket_cap_mb: float) -> list[int]:
    from torch import nn

    from distlab.core.pipeline_schedule import build
    from distlab.models import GPT
    from distlab.parallel.compose import cut_stage
    from distlab.parallel.tensor import ParallelGPT, TensorParallelComm
    from distlab.parallel.zero.optimizer import ZeroOptimizer

    gpt = ParallelGPT(GPT(CONFIG4, seed=0), TensorParallelComm(group=mesh["tp"]))
    schedule = build("interleaved" if chunks > 1 else "1f1b", PP, M, chunks=chunks)
    stage = cut_stage(gpt, mesh.coordinates["pp"], schedule)
    modules = nn.ModuleList(stage.chunks.values())  # what train_3d gives ZeroOptimizer
    zero = ZeroOptimizer(modules, torch.optim.SGD, group=mesh["dp"], bucket_cap_mb=bucket_cap_mb,
                         lr=0.1)  # fmt: skip
    return [g.padded_numel for g in zero.flat_groups]


def _zero_and_interleaved(rank, world_size):
    from distlab.parallel.compose.mesh import build_mesh
    from distlab.parallel.compose.traffic import _traced_step

    traced = {
        name: _traced_step(rank, world_size, CONFIG4, TP, PP, DP, BATCH, M, options)
        for name, options in OPTIONS.items()
    }
    mesh = build_mesh(tp=TP, pp=PP, dp=DP)
    flat = {(v, cap): _flat_group_sizes(mesh, v, cap) for v in (1, 2) for cap in SMALL_BUCKETS_MB}
    return traced, flat


@pytest.fixture(scope="module")
def zero_and_interleaved():
    return distlab.run(_zero_and_interleaved, 8, timeout=300)


def _predicted_for(zero_stage: int, chunks: int):
    from distlab.parallel.compose.traffic import predicted_three_d

    return predicted_three_d(CONFIG4, tp=TP, pp=PP, dp=DP, batch=BATCH, micro_batches=M,
                             zero_stage=zero_stage, chunks=chunks)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIONS)
def test_zero1_and_interleaved_steps_match_the_calculator(zero_and_interleaved, name):
    from distlab.parallel.compose.traffic import format_trace_table, trace_table

    calls = [c for traced, _ in zero_and_interleaved for c in traced[name]]
    zero_stage, chunks = OPTIONS[name]["zero_stage"], OPTIONS[name].get("chunks", 1)
    rows = trace_table(calls, _predicted_for(zero_stage, chunks))
    table = format_trace_table(rows)
    assert all(r.match for r in rows if r.predicted is not None), table
    modelled = {(r.group, r.collective): r for r in rows if r.predicted is not None}
    assert {k for k in modelled if k[0] == "dp"} == {
        ("dp", "reduce_scatter"), ("dp", "all_gather"), ("dp", "broadcast"), ("dp", "all_reduce"),
    }  # fmt: skip
    assert modelled[("dp", "all_reduce")].calls == DP * TP  # only the loss, on the last stage
    # one flat group per rank (the tiny GPT's stage is far below 25 MiB): 8 reduce-scatters
    assert modelled[("dp", "reduce_scatter")].calls == TP * PP * DP
    # stage 0 sends m v activations and m (v - 1) gradients, stage 1 the reverse
    assert modelled[("pp", "send")].calls == TP * DP * M * (2 * chunks - 1) * 2
    headers = {r.collective: r.calls for r in rows if r.predicted is None}
    assert headers == {"send header": modelled[("pp", "send")].calls,
                       "recv header": modelled[("pp", "recv")].calls}  # fmt: skip
    # the prediction must notice a wrong configuration
    wrong = {"zero1": (0, chunks), "interleaved": (zero_stage, 1)}[name]
    rows = trace_table(calls, _predicted_for(*wrong))
    assert not all(r.match for r in rows if r.predicted is not None), wrong


@pytest.mark.slow
def test_zero1_ranks_send_what_three_d_comm_predicts_per_step(zero_and_interleaved):
    """Per rank and group, every part but the once-per-run broadcast (whose root sends
    n and leaf 0 with dp = 2, while the calculator counts the average, n/2)."""
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
    for name, options in OPTIONS.items():
        for rank, (traced, _) in enumerate(zero_and_interleaved):
            layout = LAYOUT.with_(zero_stage=1, virtual_stages=options.get("chunks", 1))
            want = three_d_comm(spec, layout, stage=rank // (TP * DP), bytes_per_element=4)
            for group, volume in want.items():
                sent = sum(
                    c.wire_bytes
                    for c in traced[name]
                    if c.group == group and c.collective not in ("broadcast", "send header")
                )
                per_step = sum(p.bytes_sent for p in volume.parts if p.collective != "broadcast")
                assert sent == per_step, (name, rank, group)


@pytest.mark.slow
def test_zero_flat_groups_are_the_optimizers(zero_and_interleaved):
    """:func:`zero_flat_groups` on :func:`rank_parameter_tensors` cuts the buckets where
    ZeroOptimizer does, for several buckets per rank: the tensor order is the module's."""
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
    for rank, (_, flat) in enumerate(zero_and_interleaved):
        tensors = rank_parameter_tensors(spec, tp=TP, pp=PP, stage=rank // (TP * DP))
        for (chunks, cap), sizes in flat.items():
            assert len(sizes) >= 2, (chunks, cap)
            want = zero_flat_groups(tensors, dp=DP, bytes_per_element=4, bucket_cap_mb=cap)
            assert want == sizes, (rank, chunks, cap)
        assert zero_flat_groups(tensors[::-1], dp=DP, bytes_per_element=4,
                                bucket_cap_mb=SMALL_BUCKETS_MB[0]) != flat[(1, SMALL_BUCKETS_MB[0])]  # fmt: skip


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 2), (4, 3, 8), (3, 1, 5)])
def test_interleaved_sends_are_the_schedules(p, v, m):
    """three_d_comm's pp sends per stage = the SF and SB actions of the schedule
    distlab's executor runs (:func:`with_communication`)."""
    schedule = with_communication(build("interleaved" if v > 1 else "1f1b", p, m, chunks=v))
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=p * v)
    for stage, actions in enumerate(schedule.ranks):
        layout = Layout(pp=p, micro_batches=m, virtual_stages=v)
        volume = three_d_comm(spec, layout, stage=stage)["pp"]
        counted = {p.what.split()[0]: p.count for p in volume.parts}
        kinds = [a.kind for a in actions]
        assert counted.get("activations", 0) == kinds.count("SF") == m * (v - (stage == p - 1))
        assert counted.get("gradients", 0) == kinds.count("SB") == m * (v - (stage == 0))


def test_three_d_comm_rejects_what_train_3d_cannot_run():
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
    layout = Layout(pp=2, dp=2, micro_batches=2)
    with pytest.raises(ValueError, match="zero_stage=2"):
        three_d_comm(spec, layout.with_(zero_stage=2), stage=0)
    with pytest.raises(ValueError, match="pp \\* virtual_stages=6"):
        three_d_comm(spec, layout.with_(virtual_stages=3), stage=0)
    with pytest.raises(TypeError, match="layout must be a distlab.core.layout.Layout"):
        three_d_comm(spec, {"tp": 1, "pp": 2, "dp": 2}, stage=0)
    with pytest.raises(ValueError, match="stage must be an integer in 0..1"):
        three_d_comm(spec, layout, stage=2)


@pytest.mark.parametrize("dp", [2, 3, 5])
def test_zero_flat_groups_pad_like_flat_group(dp):
    """The calculator's buckets and padding are ZeroOptimizer's own construction
    (:func:`assign_buckets` in reverse order, :class:`FlatGroup` per bucket)."""
    params = trainable_parameters(GPT(CONFIG, seed=0))
    sizes = [p.numel() for p in params]
    for cap in (0.001, 0.02, 25):
        buckets = assign_buckets(params[::-1], bucket_cap_bytes(cap))
        want = [FlatGroup(bucket, 0, dp).padded_numel for bucket in buckets]
        assert zero_flat_groups(sizes, dp=dp, bytes_per_element=4, bucket_cap_mb=cap) == want
    padded = zero_flat_groups(sizes, dp=dp, bytes_per_element=4)
    assert padded == [dp * -(-sum(sizes) // dp)] and (dp == 2 or padded[0] > sum(sizes))
