"""One layout, one ``parallelize``, one loop: six layouts on 8 gloo processes, each equal to one process.

Each case is one 8-process launch of :func:`distlab.parallel.compose.train` for
10 steps of SGD with momentum, against single-process training on the whole
batch with the same optimizer:

* ``tp2_cp2_dp2``: tensor x context x data parallelism;
* ``tp2_pp2_cp2``: context parallelism inside a pipeline;
* ``tp2_ep2_pp2_dp2``: MoE blocks (experts over ep) inside a pipeline;
* ``tp2_pp2_dp2_fsdp``: FSDP over dp around each pipeline chunk (untied embeddings);
* ``tp2sp_pp2_dp2_interleaved``: sequence parallelism, interleaved schedule (v = 2);
* ``tp2_cp2_pp2_ep2``: four axes above 1 at once (ep re-splits the cp ranks).

Checked: the last stage's losses equal the single-process losses (rtol 1e-5: the
pieces add in another order than one dense step), every rank's final parameters
equal its slice of the single-process model, the slices cover the whole model,
and each group the layout uses carried bytes.

MoE routing: each micro-batch of each replica is one routing group, so the
reference routes the batch in ``dp * m`` slices (:class:`~distlab.parallel.moe_gpt.GroupedMoE`).
With cp > 1 a rank routes its part of each sequence, which no batch slicing of the
reference reproduces; the four-axis case therefore uses a capacity that drops no
token (capacity_factor = E / top_k), where routing is per token and grouping cannot matter.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.core.layout import Layout
from distlab.models import GPT, GPTConfig, gpt_batch

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
UNTIED = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4, tie_embeddings=False)
BATCH, STEPS, LR, OPTIMIZER = 8, 10, 0.1, "sgd_momentum"

# name: (layout, config, MoE settings or None)
CASES = {
    "tp2_cp2_dp2": (Layout(tp=2, cp=2, dp=2), CONFIG, None),
    "tp2_pp2_cp2": (Layout(tp=2, pp=2, cp=2, micro_batches=2), CONFIG, None),
    "tp2_ep2_pp2_dp2": (
        Layout(tp=2, ep=2, pp=2, dp=2, micro_batches=2), CONFIG, {"capacity_factor": 1.25}
    ),
    "tp2_pp2_dp2_fsdp": (Layout(tp=2, pp=2, dp=2, zero_stage=3, micro_batches=2), UNTIED, None),
    "tp2sp_pp2_dp2_interleaved": (
        Layout(tp=2, pp=2, dp=2, sequence_parallel=True, virtual_stages=2, micro_batches=2),
        CONFIG,
        None,
    ),
    "tp2_cp2_pp2_ep2": (
        Layout(tp=2, cp=2, pp=2, ep=2, micro_batches=2), CONFIG, {"capacity_factor": 4.0}
    ),
}  # fmt: skip


def make_model(config: GPTConfig, moe: dict | None, routing_groups: int = 1) -> GPT:
    """The plain model every rank starts from (and the reference, with its routing groups)."""
    if moe is None:
        return GPT(config, seed=0)
    from distlab.parallel.moe_gpt import MoEConfig, MoEGPT

    return MoEGPT(config, MoEConfig(num_experts=4, **moe), seed=0, routing_groups=routing_groups)


def _train(rank, world_size, layout, config, moe):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    model = make_model(config, moe)
    return train(model, layout, tokens, targets, steps=STEPS, lr=LR, optimizer=OPTIMIZER)


def single_process(layout: Layout, config: GPTConfig, moe: dict | None):
    from distlab.parallel.compose import OPTIMIZERS

    torch_class, kwargs, _ = OPTIMIZERS[OPTIMIZER]
    groups = layout.dp * layout.micro_batches if layout.cp == 1 else 1
    model = make_model(config, moe, routing_groups=groups)
    optimizer = torch_class(model.parameters(), lr=LR, **kwargs)
    tokens, targets = gpt_batch(BATCH, config, seed=1)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    return model, losses


def dense_slice(name: str, dense: dict, run, layout: Layout, config: GPTConfig, moe):
    """The part of the single-process model's parameter that ``run``'s rank holds as ``name``."""
    from distlab.parallel.compose import dense_shard
    from distlab.parallel.moe_gpt import dense_expert_name

    if moe is not None:
        name = dense_expert_name(name, run.coordinates["ep"], 4 // layout.ep)
    if name == "head_weight":  # the untied output layer
        name = "head.weight"
    return name, dense_shard(name, dense[name], layout.tp, run.coordinates["tp"], config.vocab)


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    layout, config, moe = CASES[request.param]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reference = single_process(layout, config, moe)
    finally:
        torch.set_num_threads(threads)
    runs = distlab.run(_train, layout.world_size, args=(layout, config, moe), timeout=300)
    return request.param, layout, config, moe, runs, reference


@pytest.mark.slow
def test_losses_equal_one_process(case):
    name, layout, _, _, runs, (_, want) = case
    assert want[-1] < 0.9 * want[0], "the reference does not train: the test would prove little"
    for run in runs:
        assert run.coordinates == layout.coordinates(run.rank)
        if run.coordinates["pp"] == layout.pp - 1:
            assert run.losses == pytest.approx(want, rel=1e-5), f"{name}, rank {run.rank}"
        else:
            assert run.losses is None


@pytest.mark.slow
def test_every_rank_holds_its_slice_of_the_one_process_model(case):
    name, layout, config, moe, runs, (model, _) = case
    dense = dict(model.named_parameters())
    covered = set()
    for run in runs:
        assert run.shards, f"{name}: rank {run.rank} holds no parameters"
        for parallel_name, value in run.shards.items():
            dense_name, want = dense_slice(parallel_name, dense, run, layout, config, moe)
            covered.add(dense_name)
            torch.testing.assert_close(
                value, want, rtol=1e-5, atol=1e-5,
                msg=lambda m, n=parallel_name, r=run.rank: f"{name}, rank {r}, {n}: {m}",
            )  # fmt: skip
    assert covered == set(dense), f"{name}: no rank holds {sorted(set(dense) - covered)}"


@pytest.mark.slow
def test_each_parallelism_communicates_in_its_own_group(case):
    name, layout, _, moe, runs, _ = case
    used = {"tp": layout.tp, "cp": layout.cp, "pp": layout.pp, "ep": layout.ep if moe else 1}
    for run in runs:
        groups = set().union(*(step.keys() for step in run.bytes_by_group))
        for group, size in used.items():
            if size > 1:
                assert group in groups, f"{name}, rank {run.rank}: nothing sent in {group}"
        assert len(run.bytes_by_group) == STEPS and len(run.step_seconds) == STEPS


def test_a_layout_is_validated_once_with_the_bad_value_named():
    with pytest.raises(ValueError, match="ep=3 must divide cp\\*dp=4"):
        Layout(cp=2, dp=2, ep=3)
    with pytest.raises(ValueError, match="sequence_parallel=True needs tp >= 2"):
        Layout(sequence_parallel=True)
    with pytest.raises(ValueError, match="virtual_stages=2 needs pp >= 2"):
        Layout(virtual_stages=2)
    with pytest.raises(ValueError, match="zero_stage must be an integer in 0..3"):
        Layout(zero_stage=4)


def test_refused_combinations_say_why():
    from distlab.parallel.compose import check_model

    with pytest.raises(ValueError, match="tie_embeddings=False"):
        check_model(GPT(CONFIG), Layout(tp=2, pp=2, zero_stage=3))
    with pytest.raises(ValueError, match="heads=4 is not divisible by the tensor-parallel size 8"):
        check_model(GPT(CONFIG), Layout(tp=8))
    with pytest.raises(ValueError, match="ep=2 needs a model with MoE blocks"):
        check_model(GPT(CONFIG), Layout(dp=2, ep=2))
    with pytest.raises(ValueError, match="seq_len"):
        check_model(GPT(CONFIG), Layout(cp=8))
    with pytest.raises(ValueError, match="zero_stage=2 with pp > 1 needs tie_embeddings=False"):
        check_model(GPT(CONFIG), Layout(pp=2, dp=2, zero_stage=2))
    with pytest.raises(ValueError, match="recompute='full' is not applied"):
        check_model(GPT(CONFIG), Layout(tp=2, recompute="full"))
    with pytest.raises(ValueError, match="places its chunks in a V"):
        check_model(GPT(CONFIG), Layout(pp=2, schedule="zb_v"))
    with pytest.raises(ValueError, match="context must be one of"):
        check_model(GPT(CONFIG), Layout(cp=2), context="star")


def _train_context(rank, world_size, layout, context):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    run = train(GPT(CONFIG, seed=0), layout, tokens, targets, steps=3, lr=LR, optimizer=OPTIMIZER,
                context=context)  # fmt: skip
    return run.losses, run.bytes_by_group[-1]


@pytest.mark.slow
@pytest.mark.parametrize("context", ["all_gather", "ulysses"])
def test_context_parallel_attention_three_ways(context):
    """The cp ranks may attend by ring (the cases above), by gathering K/V (Llama 3)
    or by all-to-all over the heads (Ulysses): the same training, other messages."""
    layout = Layout(tp=2, cp=2, dp=2)
    _, want = single_process(layout, CONFIG, None)
    runs = distlab.run(_train_context, 8, args=(layout, context), timeout=300)
    for losses, sent in runs:
        assert losses == pytest.approx(want[:3], rel=1e-5), context
        assert sent.get("cp", 0) > 0, f"{context}: nothing sent in the cp group"


def _train_recompute(rank, world_size, layout):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    run = train(GPT(CONFIG, seed=0), layout, tokens, targets, steps=3, lr=LR, optimizer=OPTIMIZER)
    return run.losses, run.peak_activation_bytes


@pytest.mark.slow
def test_selective_recomputation_keeps_the_losses_and_saves_activations():
    """Layout(recompute="selective"): the attention core is recomputed in backward
    (Korthikanti et al. 2022, Section 5): the same losses, fewer bytes kept for backward."""
    plain, selective = Layout(tp=2, dp=2), Layout(tp=2, dp=2, recompute="selective")
    _, want = single_process(plain, CONFIG, None)
    kept = {}
    for layout in (plain, selective):
        runs = distlab.run(_train_recompute, 4, args=(layout,), timeout=300)
        for losses, _ in runs:
            assert losses == pytest.approx(want[:3], rel=1e-5), layout.label()
        kept[layout.recompute] = max(peak for _, peak in runs)
    assert kept["selective"] < kept["none"], kept


def _train_dropout(rank, world_size, layout, config):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    run = train(GPT(config, seed=0), layout, tokens, targets, steps=2, lr=LR, optimizer=OPTIMIZER)
    return run.coordinates, run.shards


@pytest.mark.slow
def test_dropout_keeps_the_tensor_parallel_ranks_one_model():
    """With dropout, the tp ranks of a replica must drop the same elements of the
    replicated activations (else their LayerNorms, biases and position embeddings
    drift apart) and different ones inside the parallel region (Megatron's RNG
    tracker, distlab.parallel.tensor.rng): after two steps the replicated
    parameters are still bit for bit the same on both tp ranks."""
    config = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2, dropout=0.1)
    runs = distlab.run(_train_dropout, 4, args=(Layout(tp=2, dp=2), config), timeout=300)
    from distlab.parallel.tensor.layers import COLUMN_PARALLEL, ROW_PARALLEL

    for first, second in zip(runs[0::2], runs[1::2], strict=True):
        assert first[0]["dp"] == second[0]["dp"] and first[0]["tp"] != second[0]["tp"]
        replicated = [
            n for n in first[1]
            if n.startswith(("pos.", "ln_f.")) or (n.startswith("blocks.") and not n.split(".", 2)[2].startswith((*COLUMN_PARALLEL, *ROW_PARALLEL)))
        ]  # fmt: skip
        assert "pos.weight" in replicated and "blocks.0.ln1.weight" in replicated
        for name in replicated:
            assert torch.equal(first[1][name], second[1][name]), f"{name} differs across tp ranks"
