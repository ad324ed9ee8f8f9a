"""The collective trace of a composed run equals the calculator, group by group, on every rank.

For each layout of ``tests/test_compose.py`` (TP x CP x DP, CP inside a pipeline, MoE
blocks inside a pipeline, FSDP around pipeline chunks, SP with the interleaved
schedule, four axes at once), and five of them recomputing (``RECOMPUTED``: full, which
sends the forward's messages again but the block's closing collective and, under FSDP,
gathers the block's units again, and selective with cp, which passes the K/V round
again): one launch of 2 steps of
:func:`distlab.parallel.compose.train` on 8 gloo processes, and on every rank, every
step, the wire bytes per group (``ComposedRun.bytes_by_group``: the trace's collectives
and pipeline messages, plus the ring's K/V messages under ``"cp"``) equal
:func:`distlab.calc.layout_comm.layout_comm` for that rank exactly; the model-state bytes
equal :func:`distlab.calc.layout_comm.layout_model_state`.

The same equality in bf16 (``precision="bf16"``: the 16-bit messages weigh half) runs in
``tests/test_compose_precision.py``, on the runs that compare its losses.

Without torch: :func:`distlab.calc.three_d.three_d_comm` (the train_3d mirror, now a call of
layout_comm) is layout_comm's count on TP x PP x DP layouts plus only what train_3d sends
outside the step (ZeRO-1's one-time broadcast, the loss average).
"""

from __future__ import annotations

import pytest
import torch
from gpt_models import make_model
from test_compose import BATCH, CASES, OPTIMIZER  # the six layouts, one place

import distlab
from distlab.calc.comm import context_parallel_comm
from distlab.calc.layout_comm import (
    AUTOCAST_16_BIT,
    FSDP_FP32,
    PRECISIONS,
    MoESpec,
    layout_comm,
    layout_model_state,
)
from distlab.calc.three_d import gpt_spec, three_d_comm
from distlab.core.layout import Layout
from distlab.models import GPTConfig, gpt_batch

STEPS = 2


def spec_of(config: GPTConfig):
    return gpt_spec(vocab=config.vocab, seq_len=config.seq_len, hidden=config.hidden,
                    heads=config.heads, layers=config.layers,
                    tie_embeddings=config.tie_embeddings)  # fmt: skip


def predicted(
    layout: Layout, config: GPTConfig, moe: dict | None, rank: int, precision: str = "fp32"
) -> dict[str, float]:
    """layout_comm's bytes per group for ``rank`` of a CASES entry."""
    volumes = layout_comm(
        spec_of(config), layout, rank, micro_batch=BATCH // (layout.dp * layout.micro_batches),
        moe=MoESpec(num_experts=4, **moe) if moe else None, precision=precision,
    )  # fmt: skip
    return {name: volume.total for name, volume in volumes.items()}


def _train(rank, world_size, layout, config, moe):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    model = make_model(config, moe)
    tokens, targets = gpt_batch(BATCH, config, seed=1)
    run = train(model, layout, tokens, targets, steps=STEPS, lr=0.1, optimizer=OPTIMIZER)
    return run.rank, run.bytes_by_group, run.model_state_bytes


#: recomputation sends the forward's messages again (layout_comm's ``recomputed``)
RECOMPUTED = {
    f"{name}_{mode}": (CASES[name][0].with_(recompute=mode), *CASES[name][1:])
    for name, mode in [("tp2_cp2_dp2", "full"), ("tp2_pp2_cp2", "selective"),
                       ("tp2_cp2_pp2_ep2", "full"), ("tp2sp_pp2_dp2_interleaved", "full"),
                       ("tp2_pp2_dp2_fsdp", "full")]
}  # fmt: skip


@pytest.fixture(scope="module", params=[*CASES, *RECOMPUTED])
def traced(request):
    layout, config, moe = {**CASES, **RECOMPUTED}[request.param]
    runs = distlab.run(_train, layout.world_size, args=(layout, config, moe), timeout=300)
    return request.param, layout, config, moe, runs


@pytest.mark.slow
def test_every_rank_sends_what_layout_comm_predicts_per_group(traced):
    name, layout, config, moe, runs = traced
    for rank, steps, _ in runs:
        want = predicted(layout, config, moe, rank)
        assert all(v == int(v) for v in want.values()), f"{name}: fractional bytes {want}"
        for step, sent in enumerate(steps):
            assert sent == want, f"{name}, rank {rank}, step {step}: traced {sent}, calc {want}"


@pytest.mark.slow
def test_model_state_bytes_equal_the_calculator(traced):
    name, layout, config, moe, runs = traced
    moe_spec = MoESpec(num_experts=4, **moe) if moe else None
    for rank, _, measured in runs:
        want = layout_model_state(spec_of(config), layout, rank, moe=moe_spec)
        assert measured == want.total, f"{name}, rank {rank}"


# -- without processes ------------------------------------------------------------------

SPEC = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)


@pytest.mark.parametrize("zero_stage", [0, 1])
@pytest.mark.parametrize(("tp", "pp", "dp", "chunks"), [(2, 2, 2, 1), (2, 2, 2, 2), (1, 4, 2, 1),
                                                        (4, 1, 2, 1), (2, 1, 1, 1)])  # fmt: skip
def test_three_d_comm_is_layout_comm_plus_what_train_3d_sent_outside_the_step(
    tp, pp, dp, chunks, zero_stage
):
    layout = Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, virtual_stages=chunks,
                    micro_batches=2, micro_batch=2)  # fmt: skip
    for rank in range(layout.world_size):
        stage = layout.coordinates(rank)["pp"]
        new = layout_comm(SPEC, layout, rank, headers=False)
        old = three_d_comm(SPEC, layout, stage=stage, bytes_per_element=4, layer_buffers=(64,))
        for group, volume in old.items():
            outside = [
                p
                for p in volume.parts
                if p.collective == "broadcast" or p.what.startswith("loss average")
            ]
            per_step = volume.total - sum(p.bytes_sent for p in outside)
            if per_step:
                assert new[group].total == per_step, f"{layout.label()}, rank {rank}, {group}"
            else:
                assert group not in new, f"{layout.label()}, rank {rank}, {group}"


def test_ring_attention_sends_two_of_the_textbook_three_passes():
    """distlab's ring keeps the K/V blocks for backward: the fused kernel's second pass is absent."""
    layout = Layout(cp=2, dp=4)
    new = layout_comm(SPEC, layout, 0, micro_batch=1)
    textbook = context_parallel_comm(seq_len=4, micro_batch=1, hidden=32, layers=4, cp=2,
                                     bytes_per_element=4)  # fmt: skip
    assert new["cp"].total == 2 / 3 * textbook.total
    gather = layout_comm(SPEC, layout, 0, micro_batch=1, context="all_gather")
    assert gather["cp"].total == new["cp"].total  # (cp-1) K/V blocks each way, in 2 collectives
    assert {p.collective for p in gather["cp"].parts} == {"all_gather", "reduce_scatter"}
    ulysses = layout_comm(SPEC, layout, 0, micro_batch=1, context="ulysses")
    assert (
        ulysses["cp"].total == 8 * (2 - 1) / 2 * (1 * 4 * 32 * 4) * 4
    )  # 8 (cp-1)/cp b s h, 4 layers
    with pytest.raises(ValueError, match="context must be one of"):
        layout_comm(SPEC, layout, 0, context="star")


def test_groups_are_named_as_the_trace_names_them():
    spec = SPEC
    assert set(layout_comm(spec, Layout(tp=2, cp=2), 0)) == {"tp", "cp"}  # dp-cp is "cp"
    assert set(layout_comm(spec, Layout(cp=2, dp=2), 0)) == {"cp", "dp-cp"}
    assert set(layout_comm(spec, Layout(dp=2, pp=2), 0)) == {"dp", "pp", "embedding"}
    with pytest.raises(ValueError, match="not modelled"):
        layout_comm(spec, Layout(dp=2, pp=2, zero_stage=3, schedule="zb_h1", micro_batches=2), 0)


def _parts_by_kind(layout: Layout, moe: MoESpec | None = None) -> dict[str, dict]:
    """Every part of every rank of ``layout`` in fp32, by group kind and name."""
    kinds: dict[str, dict] = {}
    for rank in range(layout.world_size):
        for group, volume in layout_comm(SPEC, layout, rank, micro_batch=2, moe=moe).items():
            kind = {"dp": "data", "dp-cp": "data", "expert_dp": "data"}.get(group, group)
            if layout.cp > 1 and group == "cp" and layout.dp == 1:
                kind = None  # "cp" names both the context messages and the data reduction
            for part in volume.parts:
                kinds.setdefault(kind, {})[part.what] = part
    return kinds


MIXED_LAYOUTS = [
    Layout(tp=2, cp=2, dp=2, micro_batches=2), Layout(tp=2, pp=2, dp=2, sequence_parallel=True),
    Layout(tp=2, pp=2, dp=2, recompute="full"), Layout(tp=2, dp=2, sequence_parallel=True,
                                                      recompute="full"),
    Layout(tp=2, pp=2, dp=2, zero_stage=3, recompute="full"), Layout(tp=2, ep=2, dp=2),
]  # fmt: skip


def test_every_message_the_precision_tables_name_is_one_layout_comm_counts():
    """A name in AUTOCAST_16_BIT or FSDP_FP32 that no part has would silently weigh nothing
    differently: each must be a part's name (or its first clause, FSDP's unit sizes cut)."""
    seen: dict[str, set] = {}
    for layout in MIXED_LAYOUTS:
        moe = MoESpec(num_experts=4) if layout.ep > 1 else None
        for kind, parts in _parts_by_kind(layout, moe).items():
            seen.setdefault(kind, set()).update(parts)
            seen[kind].update(what.split(",")[0] for what in parts)
    for table in (AUTOCAST_16_BIT, FSDP_FP32):
        for kind, names in table.items():
            unknown = {n for n in names if n != "*"} - seen.get(kind, set())
            assert not unknown, f"{kind}: {unknown} is no part layout_comm counts"
    from distlab.parallel.compose.model import PRECISIONS as TRAIN_PRECISIONS

    assert set(PRECISIONS) == set(TRAIN_PRECISIONS)


def test_bf16_halves_the_16_bit_messages_only():
    layout = Layout(tp=2, pp=2, dp=2, micro_batches=2)
    last = layout.world_size - 1
    fp32 = layout_comm(SPEC, layout, last, micro_batch=2)
    for precision in ("bf16", "fp16"):
        half = layout_comm(SPEC, layout, last, micro_batch=2, precision=precision)
        assert half["pp"].total == fp32["pp"].total  # the residual stream stays fp32
        assert half["dp"].total == fp32["dp"].total  # fp32 gradients
        forward = {p.what: p for p in half["tp"].parts}["forward all-reduce"]
        assert forward.payload_bytes == {p.what: p for p in fp32["tp"].parts}[
            "forward all-reduce"].payload_bytes / 2  # fmt: skip
        assert half["tp"].total < fp32["tp"].total
    fsdp = layout.with_(zero_stage=3)
    full, half = (layout_comm(SPEC, fsdp, last, micro_batch=2, precision=p) for p in PRECISIONS[:2])
    headers = sum(p.bytes_sent for p in full["pp"].parts if p.what.startswith("shape header"))
    assert half["pp"].total - headers == (full["pp"].total - headers) / 2  # 16-bit activations
    gathers = [p for p in half["dp"].parts if p.collective == "all_gather"]
    scatters = [p for p in half["dp"].parts if p.collective == "reduce_scatter"]
    # two 16-bit gathers per fp32 reduce-scatter: as many bytes (in fp32, twice as many)
    assert sum(p.bytes_sent for p in gathers) == sum(p.bytes_sent for p in scatters)
    with pytest.raises(ValueError, match="precision must be one of"):
        layout_comm(SPEC, layout, 0, precision="fp8")
