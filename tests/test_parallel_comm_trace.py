"""Tracing one 3D step: every group's collectives equal distlab.calc's prediction.

One launch of TP=2 x PP=2 x DP=2 (8 gloo processes) runs one ``train_3d``
step inside ``trace_comm``. Every (group, collective) the calculator models
must match in calls, payload bytes and wire bytes, summed over the job and on
each rank (with groups of 2 ranks the ring's per-rank formula is exact); the
only unmodelled rows are the pipeline executor's 64-byte shape headers.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import distlab
from distlab.calc.comm import moe_all_to_all_comm, three_d_comm
from distlab.calc.three_d import gpt_spec, job_comm_totals, rank_volumes
from distlab.calc.transformer import model_preset, rank_parameter_tensors
from distlab.models import GPTConfig

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
TP, PP, DP, M, BATCH = 2, 2, 2, 2, 8


@pytest.fixture(scope="module")
def calls():
    from distlab.parallel.comm_table import _traced_step

    return distlab.run(_traced_step, 8, args=(CONFIG, TP, PP, DP, BATCH, M), timeout=180)


def _predicted():
    from distlab.parallel.comm_table import predicted_three_d

    return predicted_three_d(CONFIG, tp=TP, pp=PP, dp=DP, batch=BATCH, micro_batches=M)


def test_every_modelled_row_matches_the_calculator(calls):
    from distlab.parallel.comm_table import format_trace_table, trace_table

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
        want = three_d_comm(spec, tp=TP, pp=PP, dp=DP, micro_batch=BATCH // (DP * M),
                            micro_batches=M, stage=stage, bytes_per_element=4)  # fmt: skip
        for group, volume in want.items():
            sent = sum(
                c.wire_bytes
                for c in rank_calls
                if c.group == group and "header" not in c.collective
            )
            assert sent == volume.total, (rank, group)


def test_dropping_or_doubling_one_call_breaks_the_match(calls):
    from distlab.parallel.comm_table import trace_table

    flat = [c for r in calls for c in r]
    for i in (0, len(flat) // 2, len(flat) - 1):
        for changed in (flat[:i] + flat[i + 1 :], flat + [flat[i]]):
            rows = trace_table(changed, _predicted())
            assert not all(r.match for r in rows if r.predicted is not None), i


def test_the_prediction_breaks_when_the_model_is_wrong():
    predicted = _predicted()
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=2, tie_embeddings=False)
    untied = job_comm_totals(rank_volumes(spec, tp=TP, pp=PP, dp=DP, micro_batch=2,
                                          micro_batches=M, bytes_per_element=4))  # fmt: skip
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
    from distlab.calc.planner import ParallelConfig, evaluate, plan
    from distlab.calc.three_d import layout_step_time
    from distlab.sim.topology import preset

    cluster = preset("dgx-h100", nodes=1)
    found = plan("7B", cluster, global_batch=16).candidates
    config = found[0].config
    assert evaluate("7B", cluster, config) == found[0]
    with pytest.raises(ValueError, match="GPUs"):
        evaluate("7B", cluster, dataclasses.replace(config, dp=config.dp * 2))
    lt = layout_step_time(
        model_preset("7B"), cluster, tp=2, pp=2, dp=2, micro_batch=1, micro_batches=8
    )
    assert lt.estimate.config == ParallelConfig(2, 2, 2, 0, 1, 8, "none")
    assert lt.group_seconds["embedding"] == 0  # LLaMA's output layer is not tied
    assert lt.group_seconds["tp"] > lt.group_seconds["dp"] > lt.group_seconds["pp"] > 0


def test_count_traffic_nests():
    from distlab.collectives.executor import Traffic, count_traffic

    with count_traffic() as outer:
        outer.bytes_sent = 5
        with count_traffic() as inner:
            inner.add(Traffic(7, 1, {"ring_all_reduce": 7}))
    assert (outer.bytes_sent, outer.messages, outer.by_schedule) == (12, 1, {"ring_all_reduce": 7})


def test_no_trace_costs_nothing():
    from distlab.parallel.comm_trace import _IDLE, traced

    assert traced("all_reduce", None, torch.zeros(1)) is _IDLE


def _moe_step(rank, world_size):
    from distlab.parallel.comm_trace import trace_comm
    from distlab.parallel.moe import ExpertParallelMoE, MoE

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
