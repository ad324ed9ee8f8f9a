"""One layout, one ``parallelize``, one loop: six layouts on 8 gloo processes, each equal to one process.

Each case is one 8-process launch of :func:`distlab.parallel.compose.train` for
10 steps of SGD with momentum, against single-process training on the whole
batch with the same optimizer:

* ``tp2_cp2_dp2``: tensor x context x data parallelism;
* ``tp2_pp2_cp2``: context parallelism inside a pipeline;
* ``tp2_ep2_pp2_dp2``: MoE blocks (experts over ep) inside a pipeline;
* ``tp2_pp2_dp2_fsdp``: FSDP over dp around each pipeline chunk (untied embeddings);
* ``tp2sp_pp2_dp2_interleaved``: sequence parallelism, interleaved schedule (v = 2);
* ``tp2_cp2_pp2_ep2``: four axes above 1 at once (ep re-splits the cp ranks);

and the schedules whose chunks are not placed round the ranks in a loop
(:data:`SCHEDULE_CASES`): ZB-V and DualPipeV (two chunks per rank in a V, the loss on
rank 0) and DualPipe (two copies of the model, one per direction, the loss at both
ends), each with another parallelism around it.

Checked: the losses (on the ranks that compute them) equal the single-process losses (rtol 1e-5: the
pieces add in another order than one dense step), every rank's final parameters
equal its slice of the single-process model, the slices cover the whole model,
and each group the layout uses carried bytes.

MoE routing: each micro-batch of each replica is one routing group, so the
reference routes the batch in ``dp * m`` slices (:class:`~distlab.parallel.moe.gpt.GroupedMoE`).
With cp > 1 a rank routes its part of each sequence, which no batch slicing of the
reference reproduces; the four-axis case therefore uses a capacity that drops no
token (capacity_factor = E / top_k), where routing is per token and grouping cannot matter.
"""

from __future__ import annotations

import pytest
import torch
from gpt_models import make_model

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
SCHEDULE_CASES = {
    "tp2_pp2_dp2_zb_v": (
        Layout(tp=2, pp=2, dp=2, schedule="zb_v", micro_batches=4), CONFIG, None
    ),
    "tp2_cp2_pp2_dualpipe": (
        Layout(tp=2, cp=2, pp=2, schedule="dualpipe", micro_batches=4), CONFIG, None
    ),
    "tp2_ep2_pp2_dp2_dualpipe_v": (
        Layout(tp=2, ep=2, pp=2, dp=2, schedule="dualpipe_v", micro_batches=4),
        CONFIG,
        {"capacity_factor": 1.25},
    ),
}  # fmt: skip
#: MoE layers under FSDP: the router is called as a module, so FSDP gathers its weight
MORE_CASES = {
    "dp2_fsdp_moe": (Layout(dp=2, zero_stage=3, micro_batches=2), CONFIG, {"capacity_factor": 1.25}),
}  # fmt: skip


def loss_holders(layout: Layout) -> set[int]:
    """The pipeline ranks that report the loss: the one holding the last virtual stage
    (rank 0 for a V), both ends for DualPipe's two directions."""
    p = layout.pp
    return {"zb_v": {0}, "dualpipe_v": {0}, "dualpipe": {0, p - 1}}.get(
        layout.pipeline_schedule, {p - 1}
    )


def _train(rank, world_size, layout, config, moe):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    model = make_model(config, moe)  # the plain model every rank starts from
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
    from distlab.parallel.moe.gpt import dense_expert_name

    if moe is not None:
        name = dense_expert_name(name, run.coordinates["ep"], 4 // layout.ep)
    if name == "head_weight":  # the untied output layer
        name = "head.weight"
    return name, dense_shard(name, dense[name], layout.tp, run.coordinates["tp"], config.vocab)


@pytest.fixture(scope="module", params=[*CASES, *SCHEDULE_CASES, *MORE_CASES])
def case(request):
    layout, config, moe = {**CASES, **SCHEDULE_CASES, **MORE_CASES}[request.param]
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
        if run.coordinates["pp"] in loss_holders(layout):
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
    with pytest.raises(ValueError, match="zero_stage=2 with schedule 'dualpipe'"):
        check_model(GPT(UNTIED), Layout(pp=2, dp=2, zero_stage=2, schedule="dualpipe",
                                        micro_batches=4))  # fmt: skip
    with pytest.raises(ValueError, match="layers=4 is not divisible by the number of virtual"):
        check_model(GPT(CONFIG), Layout(pp=4, schedule="zb_v", micro_batches=8))
    check_model(GPT(CONFIG), Layout(pp=4, schedule="dualpipe", micro_batches=8))  # 4 parts
    with pytest.raises(ValueError, match="context must be one of"):
        check_model(GPT(CONFIG), Layout(cp=2), context="star")


def test_parallelize_alone_refuses_a_bad_layout_before_any_process_group():
    """parallelize is public: it checks the model and layout itself (check_model), first."""
    from distlab.parallel.compose import parallelize

    with pytest.raises(ValueError, match="heads=4 is not divisible by the tensor-parallel size 8"):
        parallelize(GPT(CONFIG), Layout(tp=8))  # no process group here: the check comes first
    with pytest.raises(TypeError, match="layout must be a distlab Layout, got dict"):
        parallelize(GPT(CONFIG), {"tp": 2})
    with pytest.raises(RuntimeError, match="no process group"):
        parallelize(GPT(CONFIG), Layout(tp=2))  # a good layout gets as far as the groups


def test_check_train_checks_the_layout_against_the_model_and_the_batch():
    from distlab.parallel.compose.loop import check_train

    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    schedule = check_train(GPT(CONFIG), Layout(pp=2, micro_batches=4), tokens, targets)
    assert (schedule.name, schedule.stages, schedule.micro_batches) == ("1f1b", 2, 4)
    with pytest.raises(ValueError, match="batch=8 is not divisible by the dp \\* micro_batches 3"):
        check_train(GPT(CONFIG), Layout(dp=3), tokens, targets)
    with pytest.raises(ValueError, match="heads=4 is not divisible by the tensor-parallel size 8"):
        check_train(GPT(CONFIG), Layout(tp=8), tokens, targets)
    with pytest.raises(ValueError, match="targets of shape"):
        check_train(GPT(CONFIG), Layout(), tokens, targets[:2])


def _count_checks(rank, world_size):
    """train on one rank with check_model counted wherever compose looks it up."""
    torch.set_num_threads(1)
    from distlab.parallel.compose import loop, model, train

    calls = []
    check_model = model.check_model

    def counted(*args, **kwargs):
        calls.append(args[1])
        return check_model(*args, **kwargs)

    loop.check_model = model.check_model = counted
    try:
        tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
        train(GPT(CONFIG, seed=0), Layout(micro_batches=2), tokens, targets, steps=1, lr=LR)
    finally:
        loop.check_model = model.check_model = check_model
    return calls


@pytest.mark.slow  # a process of its own
def test_train_checks_the_layout_against_the_model_once():
    (calls,) = distlab.run(_count_checks, 1, timeout=120)
    assert calls == [Layout(micro_batches=2)]


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


def _train_recompute(rank, world_size, layout, config=CONFIG, steps=3):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    run = train(GPT(config, seed=0), layout, tokens, targets, steps=steps, lr=LR,
                optimizer=OPTIMIZER)  # fmt: skip
    return run.losses, run.peak_activation_bytes, run.coordinates, run.shards


@pytest.mark.slow
@pytest.mark.parametrize(
    "degrees", [{"tp": 2, "dp": 2}, {"tp": 2, "cp": 2}], ids=["tp2_dp2", "tp2_cp2"]
)
def test_recomputation_keeps_the_losses_and_saves_activations(degrees):
    """Layout(recompute=...): "selective" recomputes the attention core in backward
    (Korthikanti et al. 2022, Section 5; with cp the ring passes K/V again), "full" the
    whole block: the same losses, fewer bytes kept for backward, fewest with "full"."""
    _, want = single_process(Layout(**degrees), CONFIG, None)
    kept = {}
    for mode in ("none", "selective", "full"):
        layout = Layout(**degrees, recompute=mode)
        runs = distlab.run(_train_recompute, 4, args=(layout,), timeout=300)
        for losses, *_ in runs:
            assert losses == pytest.approx(want[:3], rel=1e-5), layout.label()
        kept[mode] = max(peak for _, peak, *_ in runs)
    assert kept["full"] < kept["selective"] < kept["none"], kept


@pytest.mark.slow
def test_full_recomputation_keeps_each_block_s_input_as_the_calculator_counts():
    """With pp = 4 and 4 layers, pipeline ranks 1 and 2 hold one block each and nothing
    else, so with recompute="full" all they keep for backward is that block's input per
    micro-batch in flight: the calculator's 2sbh bytes per layer (16-bit) at 4 bytes an
    element, times the micro-batches 1F1B holds there (the replay's peak)."""
    from distlab.calc.memory import activation_bytes_per_layer
    from distlab.core.pipeline_schedule import one_f_one_b
    from distlab.sim.pipeline_replay import replay

    layout = Layout(pp=4, micro_batches=4, recompute="full")
    runs = distlab.run(_train_recompute, 4, args=(layout, CONFIG, 1), timeout=300)
    in_flight = replay(one_f_one_b(4, 4)).peak_in_flight
    micro_batch = BATCH // layout.micro_batches
    per_layer = activation_bytes_per_layer(
        seq_len=CONFIG.seq_len, micro_batch=micro_batch, hidden=CONFIG.hidden,
        heads=CONFIG.heads, recompute="full",
    ) * 4 / 2  # fmt: skip
    for _, peak, where, _ in runs:
        if where["pp"] in (1, 2):
            assert peak == in_flight[where["pp"]] * per_layer, where


@pytest.mark.slow
def test_full_recomputation_replays_the_dropout_masks():
    """With dropout and tp = 2, the recomputed forward must draw the masks the forward
    drew, from the default stream and from the tensor-parallel one (Megatron's tracker,
    replayed by RecomputedBlock): the same parameters after two steps as without
    recomputation, to rounding."""
    config = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2, dropout=0.1)
    final = {}
    for mode in ("none", "full"):
        layout = Layout(tp=2, dp=2, recompute=mode)
        runs = distlab.run(_train_recompute, 4, args=(layout, config, 2), timeout=300)
        final[mode] = [shards for *_, shards in runs]
    for plain, recomputed in zip(final["none"], final["full"], strict=True):
        for name in plain:
            torch.testing.assert_close(recomputed[name], plain[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m, name=name: f"{name}: {m}")  # fmt: skip


def _train_aux(rank, world_size, layout, aux_weight):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    model = make_model(CONFIG, {"capacity_factor": 1.25})
    run = train(model, layout, tokens, targets, steps=3, lr=LR, optimizer=OPTIMIZER,
                aux_weight=aux_weight)  # fmt: skip
    return run


@pytest.mark.slow
def test_moe_balancing_loss_trains_every_pipeline_stage():
    """aux_weight > 0 with pp = 2: each stage adds its own MoE layers' balancing loss
    (the executor's side loss), so the first stage's routers get that gradient too, as
    in one process; the loss reported (summed over the stages) equals the one process's."""
    from distlab.parallel.compose import OPTIMIZERS
    from distlab.parallel.moe.gpt import aux_loss

    layout, aux_weight = Layout(pp=2, dp=2, ep=2, micro_batches=2), 0.5
    torch_class, kwargs, _ = OPTIMIZERS[OPTIMIZER]
    references = {}
    for weight in (0.0, aux_weight):
        model = make_model(CONFIG, {"capacity_factor": 1.25}, routing_groups=4)
        optimizer = torch_class(model.parameters(), lr=LR, **kwargs)
        tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
        losses = []
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss = model.loss(tokens, targets) + weight * aux_loss(model)
            loss.backward()
            losses.append(loss.item())
            optimizer.step()
        references[weight] = model, losses
    model, want = references[aux_weight]
    dense = dict(model.named_parameters())
    without = dict(references[0.0][0].named_parameters())
    first_router = next(n for n in dense if n.endswith("router.weight"))
    assert not torch.allclose(dense[first_router], without[first_router]), "aux changes nothing"
    runs = distlab.run(_train_aux, 4, args=(layout, aux_weight), timeout=300)
    for run in runs:
        if run.coordinates["pp"] == 1:
            assert run.losses == pytest.approx(want, rel=1e-5)
        for name, value in run.shards.items():
            dense_name, expected = dense_slice(name, dense, run, layout, CONFIG,
                                               {"capacity_factor": 1.25})  # fmt: skip
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, n=dense_name: f"{n}: {m}")  # fmt: skip
    assert any(first_router in run.shards for run in runs if run.coordinates["pp"] == 0)


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
