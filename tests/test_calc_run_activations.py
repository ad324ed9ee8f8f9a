"""The bytes a composed run keeps for backward equal :mod:`distlab.calc.run_activations`.

Each layout below trains the tiny GPT one step with :func:`distlab.parallel.compose.train`
and every rank's ``peak_activation_bytes`` (the executor's saved-tensor count) must equal
the calculator's peak for that rank *exactly*: tensor parallelism with each recomputation
mode and with dropout, sequence parallelism in an interleaved pipeline and under full
recomputation, 1F1B on 4 stages, ZB-V (split backward, chunks in a V), DualPipe (two
copies), context parallelism by K/V all-gather and by Ulysses (in a pipeline), and ring
attention (zig-zag in a pipeline with SP, contiguous, one sequence per micro-batch) and
under full and selective recomputation (Ulysses too), FSDP in a pipeline and FSDP with full recomputation
(the gathered weights a layer keeps are model state, not activations). In 16 bits
(autocast), a choice of them that exercises each of its terms: the fp32 stream and the
per-linear casts (with dropout, with sequence parallelism), the weight copies shared by
the micro-batches in flight (an interleaved pipeline, 1F1B in fp16), the 16-bit attention
cores of context parallelism, the fp32 block input of full recomputation and FSDP's 16-bit
parameters. MoE layers (ep > 1) given the assignments each forward kept (which the run
reports), in fp32 and bf16, top-1 and top-2, with and without dropped tokens; without
them the calculator's capacity bound is an upper bound. Without torch: the in-flight walk
against the schedules' closed forms, and what the count leaves out is refused by name.
"""

from __future__ import annotations

import pytest
import torch
from gpt_models import make_model

import distlab
from distlab.calc.layout_comm import MoESpec
from distlab.calc.memory import activation_bytes_per_layer
from distlab.calc.run_activations import chunk_activations, in_flight_peak, layout_activations
from distlab.calc.three_d import gpt_spec
from distlab.core.layout import Layout
from distlab.models import GPTConfig, gpt_batch

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
DROPOUT = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4, dropout=0.1)
UNTIED = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4, tie_embeddings=False)
BATCH = 8

LAYOUTS = {
    "tp2_dp2": (Layout(tp=2, dp=2), CONFIG),
    "tp2_dp2_selective": (Layout(tp=2, dp=2, recompute="selective"), CONFIG),
    "tp2_dp2_full": (Layout(tp=2, dp=2, recompute="full"), CONFIG),
    "tp2_dp2_dropout": (Layout(tp=2, dp=2), DROPOUT),
    "tp2sp_pp2_dp2_interleaved": (
        Layout(tp=2, pp=2, dp=2, sequence_parallel=True, virtual_stages=2, micro_batches=2),
        CONFIG,
    ),
    "tp2sp_pp2_full": (
        Layout(tp=2, pp=2, sequence_parallel=True, micro_batches=2, recompute="full"),
        CONFIG,
    ),
    "pp4_1f1b": (Layout(pp=4, micro_batches=4), CONFIG),
    "pp2_zb_v": (Layout(pp=2, schedule="zb_v", micro_batches=4), CONFIG),
    "pp2_dualpipe": (Layout(pp=2, schedule="dualpipe", micro_batches=4), CONFIG),
    "tp2_cp2_all_gather": (Layout(tp=2, cp=2), CONFIG, "all_gather"),
    "tp2_cp2_pp2_ulysses": (Layout(tp=2, cp=2, pp=2, micro_batches=2), CONFIG, "ulysses"),
    "tp2_cp2_ring_full": (Layout(tp=2, cp=2, recompute="full"), CONFIG),
    "tp2_cp2_ring": (Layout(tp=2, cp=2), CONFIG),
    "tp2sp_cp2_pp2_ring": (
        Layout(tp=2, cp=2, pp=2, sequence_parallel=True, micro_batches=2),
        CONFIG,
    ),
    "cp4_ring_contiguous": (Layout(cp=4), CONFIG, "ring", "contiguous"),
    "cp2_dp2_ring_one_sequence": (Layout(cp=2, dp=2, micro_batches=4), CONFIG),
    "tp2_cp2_ring_selective": (Layout(tp=2, cp=2, recompute="selective"), CONFIG),
    "tp2_cp2_ulysses_selective": (Layout(tp=2, cp=2, recompute="selective"), CONFIG, "ulysses"),
    "tp2_pp2_dp2_fsdp": (Layout(tp=2, pp=2, dp=2, zero_stage=3, micro_batches=2), UNTIED),
    "cp2_dp2_fsdp_full_all_gather": (
        Layout(cp=2, dp=2, zero_stage=3, recompute="full"),
        CONFIG,
        "all_gather",
    ),
}


def spec_of(config: GPTConfig):
    return gpt_spec(vocab=config.vocab, seq_len=config.seq_len, hidden=config.hidden,
                    heads=config.heads, layers=config.layers,
                    tie_embeddings=config.tie_embeddings)  # fmt: skip


#: 16-bit runs: (LAYOUTS name, precision), one per term autocast adds or changes
SIXTEEN_BIT = [
    ("tp2_dp2_dropout", "bf16"),  # fp32 stream, q/k/v casts, weight copies, dropout masks
    ("tp2sp_pp2_dp2_interleaved", "bf16"),  # SP's fp32 shards; copies once per chunk (v = 2)
    ("pp4_1f1b", "fp16"),  # fp16 counts as bf16; one copy for 4 micro-batches in flight
    ("tp2_cp2_pp2_ulysses", "bf16"),  # a context-parallel core in 16 bits
    ("tp2_cp2_ring_full", "bf16"),  # full recomputation keeps an fp32 block input
    ("tp2_pp2_dp2_fsdp", "bf16"),  # FSDP gathers 16-bit parameters: a 16-bit stream
]
MOE_CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
#: MoE layouts (4 experts, a MoE MLP every other block): (layout, MoE settings, precision)
MOE_LAYOUTS = {
    "tp2_ep2_pp2_dp2": (  # tests/test_compose.py's: tokens dropped, two micro-batches
        Layout(tp=2, ep=2, pp=2, dp=2, micro_batches=2), {"capacity_factor": 1.25}, "fp32"
    ),
    "tp2_cp2_pp2_ep2": (  # its four axes, in bf16 (no token dropped)
        Layout(tp=2, cp=2, pp=2, ep=2, micro_batches=2), {"capacity_factor": 4.0}, "bf16"
    ),
    "tp2_ep2_pp2_dp2_dualpipe_v": (  # expert weight copies shared by 4 micro-batches
        Layout(tp=2, ep=2, pp=2, dp=2, schedule="dualpipe_v", micro_batches=4),
        {"capacity_factor": 1.25},
        "bf16",
    ),
    "dp2_fsdp_bf16": (  # FSDP's gathered 16-bit router weight: an fp32 copy per forward
        Layout(dp=2, zero_stage=3, micro_batches=2), {"capacity_factor": 1.25}, "bf16"
    ),
    "ep2_dp2_top2": (  # top-2 gates, every second assignment past capacity 1.0 dropped
        Layout(ep=2, dp=2, micro_batches=2), {"capacity_factor": 1.0, "top_k": 2}, "fp32"
    ),
}  # fmt: skip


def _train(rank, world_size, layout, config, context, split="zigzag", precision="fp32",
           moe=None):  # fmt: skip
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    model = make_model(config, moe)
    run = train(model, layout, tokens, targets, steps=1, lr=0.1, context=context, split=split,
                precision=precision)  # fmt: skip
    return run.rank, run.peak_activation_bytes, run.moe_kept[0]


def _check_every_rank(name: str, precision: str = "fp32") -> None:
    layout, config, *how = LAYOUTS[name]
    context, split = (*how, "zigzag")[:2] if how else ("ring", "zigzag")
    micro_batch = BATCH // (layout.dp * layout.micro_batches)
    args = (layout, config, context, split, precision)
    for rank, measured, _ in distlab.run(_train, layout.world_size, args=args, timeout=300):
        want, _ = layout_activations(spec_of(config), layout, rank, micro_batch=micro_batch,
                                     dropout=config.dropout, context=context, split=split,
                                     bytes_per_element=4 if precision == "fp32" else 2)  # fmt: skip
        assert measured == want, (name, precision, rank, measured, want)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_keeps_exactly_what_the_calculator_counts(name):
    _check_every_rank(name)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "precision"), SIXTEEN_BIT)
def test_16_bit_runs_keep_exactly_what_the_calculator_counts(name, precision):
    """Under autocast the fp32 stream, the 16-bit casts and the cached weight copies (held
    once while any micro-batch of their chunk is in flight) are counted exactly."""
    _check_every_rank(name, precision)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MOE_LAYOUTS))
def test_moe_runs_keep_exactly_what_the_calculator_counts_given_the_routing(name):
    """With the assignments each forward's MoE layers kept (``ComposedRun.moe_kept``) the
    count is exact on every rank; without them, the capacity bound is an upper bound."""
    layout, moe, precision = MOE_LAYOUTS[name]
    spec, moe_spec = spec_of(MOE_CONFIG), MoESpec(num_experts=4, **moe)
    micro_batch = BATCH // (layout.dp * layout.micro_batches)
    args = (layout, MOE_CONFIG, "ring", "zigzag", precision, {"num_experts": 4, **moe})
    for rank, measured, kept in distlab.run(_train, layout.world_size, args=args, timeout=300):
        count = {"micro_batch": micro_batch, "moe": moe_spec,
                 "bytes_per_element": 4 if precision == "fp32" else 2}  # fmt: skip
        want, _ = layout_activations(spec, layout, rank, **count, kept=kept)
        assert measured == want, (name, rank, measured, want)
        bound, _ = layout_activations(spec, layout, rank, **count)
        assert bound >= measured, (name, rank, measured, bound)


def test_the_layer_term_is_korthikanti_s_table_and_the_rest_is_named():
    """One chunk of TP2 without pipeline: the layers term is the paper's table at 4 bytes
    without dropout; the others are the terms the paper leaves out."""
    layout, s, b, h = Layout(tp=2), CONFIG.seq_len, 4, CONFIG.hidden
    (chunk,) = chunk_activations(spec_of(CONFIG), layout, 0, micro_batch=b)
    layer = activation_bytes_per_layer(seq_len=s, micro_batch=b, hidden=h, heads=4, tp=2,
                                       dropout=False, bytes_per_element=4)  # fmt: skip
    assert chunk.terms["layers (Korthikanti et al. 2022, Table 2)"] == 4 * layer
    assert chunk.terms["layer-norm statistics"] == 4 * 2 * 8 * b * s
    assert chunk.terms["logits and loss (fp32)"] == 4 * b * s * 31 + 13 * b * s
    assert set(chunk.terms) == {
        "layers (Korthikanti et al. 2022, Table 2)", "layer-norm statistics",
        "embedding (ids, positions, vocabulary mask)", "final norm and head input",
        "logits and loss (fp32)",
    }  # fmt: skip


def test_16_bit_terms_are_named_and_the_weight_copies_held_once_per_chunk():
    """One chunk of TP2 in bf16: the table at 2 bytes, the fp32 norms' inputs and q/k/v's
    own copies beyond it, and the 16-bit copies of every weight a linear saves (q, k, v,
    proj, fc1, fc2: 12 h^2/t a layer, and the head's ceil(V/t) h) as a once-per-chunk term."""
    b, s, h = 4, CONFIG.seq_len, CONFIG.hidden
    (chunk,) = chunk_activations(spec_of(CONFIG), Layout(tp=2), 0, micro_batch=b,
                                 bytes_per_element=2)  # fmt: skip
    layer = activation_bytes_per_layer(seq_len=s, micro_batch=b, hidden=h, heads=4, tp=2,
                                       dropout=False, bytes_per_element=2)  # fmt: skip
    assert chunk.terms["layers (Korthikanti et al. 2022, Table 2)"] == 4 * layer
    assert chunk.terms["autocast: fp32 stream, per-linear casts"] == 4 * (2 * 2 + 2 * 2) * b * s * h
    assert chunk.once == {"autocast: 16-bit weight copies": 2 * (4 * 12 * h * h / 2 + 31 * h)}


@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 8), (2, 6)])
def test_the_in_flight_walk_gives_1f1b_and_gpipe_s_counts(p, m):
    """1F1B holds min(p - r, m) micro-batches on rank r at its peak, GPipe all m; what
    every micro-batch saves alike is held once."""
    for r in range(p):
        one = Layout(pp=p, micro_batches=m)
        assert in_flight_peak(one, r, lambda c, i: 1.0) == min(p - r, m)
        assert in_flight_peak(one.with_(schedule="gpipe"), r, lambda c, i: 1.0) == m
        assert in_flight_peak(one, r, lambda c, i: 1.0, once=[10.0]) == min(p - r, m) + 10


def test_what_is_not_modelled_is_refused_by_name():
    spec, moe = spec_of(CONFIG), MoESpec(num_experts=4)
    with pytest.raises(ValueError, match="ep=2 needs moe=MoESpec"):
        layout_activations(spec, Layout(tp=2, dp=2, ep=2), 0, micro_batch=1)
    with pytest.raises(ValueError, match="num_experts=4 is not divisible by ep=3"):
        layout_activations(spec, Layout(ep=3, dp=3), 0, micro_batch=1, moe=moe)
    with pytest.raises(ValueError, match="bytes_per_element=1: run activations are counted"):
        layout_activations(spec, Layout(tp=2), 0, micro_batch=1, bytes_per_element=1)


def test_without_the_routing_the_kept_indices_are_the_capacity_bound():
    """Each kept assignment leaves three int64 indices; at most min(T k, E C) are kept."""
    spec, moe = spec_of(CONFIG), MoESpec(num_experts=4, capacity_factor=1.25)
    (chunk,) = chunk_activations(spec, Layout(dp=2, ep=2), 0, micro_batch=4, moe=moe)
    tokens, capacity = 4 * CONFIG.seq_len, 10  # ceil(1.25 x 32 / 4)
    bound = "MoE kept-token indices (capacity bound: an upper bound)"
    assert chunk.terms[bound] == 2 * 24 * min(tokens, 4 * capacity)  # two MoE layers
    (chunk,) = chunk_activations(spec, Layout(dp=2, ep=2), 0, micro_batch=4, moe=moe,
                                 kept={0: 57})  # fmt: skip
    assert chunk.terms["MoE kept-token indices"] == 24 * 57


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_the_ring_visits_2cp_plus_1_pairs_zigzag_and_r_plus_1_contiguous(cp):
    """ring_attention skips a key chunk wholly after the query chunk: zig-zag balances the
    2 cp + 1 pairs over every rank and step, the contiguous split gives rank r r + 1."""
    from distlab.calc.run_activations import ring_pairs

    for r in range(cp):
        assert ring_pairs(cp, r, "zigzag") == (2 * cp + 1, cp, 2)
        assert ring_pairs(cp, r, "contiguous") == (r + 1, r + 1, 1)
