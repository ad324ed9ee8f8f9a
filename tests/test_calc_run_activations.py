"""The bytes a composed run keeps for backward equal :mod:`distlab.calc.run_activations`.

Each layout below trains the tiny GPT one step with :func:`distlab.parallel.compose.train`
and every rank's ``peak_activation_bytes`` (the executor's saved-tensor count) must equal
the calculator's peak for that rank *exactly*: tensor parallelism with each recomputation
mode and with dropout, sequence parallelism in an interleaved pipeline and under full
recomputation, 1F1B on 4 stages, ZB-V (split backward, chunks in a V), DualPipe (two
copies), context parallelism by K/V all-gather and by Ulysses (in a pipeline), and ring
attention (zig-zag in a pipeline with SP, contiguous, one sequence per micro-batch) and
under full and selective recomputation (Ulysses too), FSDP in a pipeline and FSDP with full recomputation
(the gathered weights a layer keeps are model state, not activations). Without torch: the in-flight walk against the schedules' closed forms, and the
layouts the count leaves out are refused by name.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.calc.memory import activation_bytes_per_layer
from distlab.calc.run_activations import chunk_activations, in_flight_peak, layout_activations
from distlab.calc.three_d import gpt_spec
from distlab.core.layout import Layout
from distlab.models import GPT, GPTConfig, gpt_batch

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


def _train(rank, world_size, layout, config, context, split="zigzag"):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    run = train(GPT(config, seed=0), layout, tokens, targets, steps=1, lr=0.1, context=context,
                split=split)  # fmt: skip
    return run.rank, run.peak_activation_bytes


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_keeps_exactly_what_the_calculator_counts(name):
    layout, config, *how = LAYOUTS[name]
    context, split = (*how, "zigzag")[:2] if how else ("ring", "zigzag")
    micro_batch = BATCH // (layout.dp * layout.micro_batches)
    args = (layout, config, context, split)
    for rank, measured in distlab.run(_train, layout.world_size, args=args, timeout=300):
        want, _ = layout_activations(spec_of(config), layout, rank, micro_batch=micro_batch,
                                     dropout=config.dropout, context=context, split=split)  # fmt: skip
        assert measured == want, (name, rank, measured, want)


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


@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 8), (2, 6)])
def test_the_in_flight_walk_gives_1f1b_and_gpipe_s_counts(p, m):
    """1F1B holds min(p - r, m) micro-batches on rank r at its peak, GPipe all m."""
    for r in range(p):
        one = Layout(pp=p, micro_batches=m)
        assert in_flight_peak(one, r, [1.0]) == min(p - r, m)
        assert in_flight_peak(one.with_(schedule="gpipe"), r, [1.0]) == m


def test_what_is_not_modelled_is_refused_by_name():
    spec = spec_of(CONFIG)
    for layout, words in [
        (Layout(tp=2, dp=2, ep=2), "ep=2: the MoE layers' dispatch and combine buffers"),
    ]:
        with pytest.raises(ValueError, match=words):
            layout_activations(spec, layout, 0, micro_batch=1)
    with pytest.raises(ValueError, match="2-byte activations: autocast"):
        layout_activations(spec, Layout(tp=2), 0, micro_batch=1, bytes_per_element=2)


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_the_ring_visits_2cp_plus_1_pairs_zigzag_and_r_plus_1_contiguous(cp):
    """ring_attention skips a key chunk wholly after the query chunk: zig-zag balances the
    2 cp + 1 pairs over every rank and step, the contiguous split gives rank r r + 1."""
    from distlab.calc.run_activations import ring_pairs

    for r in range(cp):
        assert ring_pairs(cp, r, "zigzag") == (2 * cp + 1, cp, 2)
        assert ring_pairs(cp, r, "contiguous") == (r + 1, r + 1, 1)
