"""Mixed precision in the composed loop: ``train(..., precision="bf16" | "fp16")``.

**bf16, the six layouts** of ``tests/test_compose.py`` (TP x CP x DP, CP inside a pipeline,
MoE over ep inside a pipeline, FSDP around pipeline chunks, SP with the interleaved
schedule, four axes at once), 10 steps of momentum SGD on 8 gloo processes, against
one process training the same model under ``torch.autocast(bfloat16)`` with the same
optimizer: the recipe of torch's automatic mixed precision, fp32 parameters (the
masters) and gradients, 16-bit matmuls.

The tolerance, and why: bf16 keeps 8 significant bits, so every rounding moves a value
by up to 2^-9 = 2e-3 of itself. A layout rounds where one process does not: the two
partial sums of a row-parallel matmul are each rounded to bf16 before the tp all-reduce
adds them (in bf16), ring attention rounds each block's partial result, FSDP computes
with bf16 copies of its LayerNorm weights. Ten steps carry those differences on.
Measured, the largest relative difference of a loss from the one-process bf16 run is
1.7e-2 (the MoE layouts; 1.2e-2 the largest dense one), so the bound is 3e-2. The run
must also really be 16-bit: its losses differ from the fp32 run's by more than 1e-4
(measured at least 1.4e-3), where the fp32 layouts equal one process to 1e-5. On every
rank and step, the wire bytes per group equal ``layout_comm(..., precision="bf16")``:
the messages that carry 16-bit tensors weigh half, the others as in fp32.

**fp16 with dynamic loss scaling**, FSDP (TP2 x PP2 x DP2) and ZeRO-2 (TP2 x DP2),
starting at a scale of 2^20, which overflows float16 in backward: every rank of every
stage skips the same steps (the overflow flag is all-reduced over the whole job, though
under ZeRO-2 and FSDP each rank sees only its shard of the gradients), beginning with
the steps a one-process fp16 run with the same scaler skips while the scale is far too
large. Later, with the scale near the overflow threshold, a step may overflow in one run
and not in the other (each rank backpropagates its own share of the batch: measured,
ZeRO-2 skipped steps 1, 2 where one process skipped 1, 2, 7, 9; FSDP matched), so the
losses are compared up to the first step whose skip differs: within 1e-2 (fp16 keeps
11 significant bits).
"""

from __future__ import annotations

import pytest
import torch
from gpt_models import make_model
from test_compose import BATCH, CASES, LR, OPTIMIZER, STEPS
from test_compose_traffic import predicted

import distlab
from distlab.core.layout import Layout
from distlab.models import gpt_batch

BF16_RTOL = 3e-2
FP16_RTOL = 1e-2
FP16_INIT_SCALE = 2.0**20
FP16_CASES = {
    "tp2_pp2_dp2_fsdp": CASES["tp2_pp2_dp2_fsdp"],
    "tp2_dp2_zero2": (Layout(tp=2, dp=2, zero_stage=2), CASES["tp2_cp2_dp2"][1], None),
}


def _train(rank, world_size, layout, config, moe, precision):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train
    from distlab.parallel.precision.mixed_precision import DynamicLossScaler

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    scaler = DynamicLossScaler(FP16_INIT_SCALE) if precision == "fp16" else None
    run = train(make_model(config, moe), layout, tokens, targets, steps=STEPS, lr=LR,
                optimizer=OPTIMIZER, precision=precision, loss_scaler=scaler)  # fmt: skip
    return run.rank, run.losses, run.skipped_steps, run.precision, run.bytes_by_group


def one_process(layout: Layout, config, moe, dtype: torch.dtype | None):
    """The losses and skipped steps of one process on the whole batch: fp32, or autocast to
    ``dtype`` (fp16 with a dynamic loss scale, written out here as the oracle)."""
    from distlab.parallel.compose import OPTIMIZERS
    from distlab.parallel.precision.mixed_precision import DynamicLossScaler, grads_are_finite

    torch_class, kwargs, _ = OPTIMIZERS[OPTIMIZER]
    groups = layout.dp * layout.micro_batches if layout.cp == 1 else 1
    model = make_model(config, moe, routing_groups=groups)
    optimizer = torch_class(model.parameters(), lr=LR, **kwargs)
    scaler = DynamicLossScaler(FP16_INIT_SCALE) if dtype is torch.float16 else None
    tokens, targets = gpt_batch(BATCH, config, seed=1)
    losses, skipped = [], []
    for step in range(1, STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model.loss(tokens, targets)
        losses.append(loss.item())
        if scaler is None:
            loss.backward()
            optimizer.step()
            continue
        (loss * scaler.scale).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        scale, overflow = scaler.scale, not grads_are_finite(grads)
        scaler.update(overflow)
        if overflow:
            skipped.append(step)
            continue
        for grad in grads:
            grad.div_(scale)
        optimizer.step()
    return losses, skipped


def _single_threaded(fn, *args):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def _max_relative(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_bf16_layouts_stay_within_rounding_of_one_bf16_process(name):
    layout, config, moe = CASES[name]
    want, _ = _single_threaded(one_process, layout, config, moe, torch.bfloat16)
    fp32, _ = _single_threaded(one_process, layout, config, moe, None)
    assert want[-1] < 0.9 * want[0], "the bf16 reference does not train"
    runs = distlab.run(_train, layout.world_size, args=(layout, config, moe, "bf16"), timeout=300)
    reported = [losses for _, losses, _, _, _ in runs if losses is not None]
    assert reported and all(losses == reported[0] for losses in reported), name
    assert all(skipped == [] and precision == "bf16" for _, _, skipped, precision, _ in runs)
    assert _max_relative(reported[0], want) < BF16_RTOL, (name, reported[0], want)
    assert _max_relative(reported[0], fp32) > 1e-4, f"{name}: bf16 gave the fp32 losses"
    for rank, _, _, _, steps in runs:  # the 16-bit messages weigh half (layout_comm's tables)
        calc = predicted(layout, config, moe, rank, precision="bf16")
        for step, sent in enumerate(steps):
            assert sent == calc, f"{name}, rank {rank}, step {step}: traced {sent}, calc {calc}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FP16_CASES))
def test_fp16_skips_the_same_overflowing_steps_on_every_rank(name):
    layout, config, moe = FP16_CASES[name]
    want, want_skipped = _single_threaded(one_process, layout, config, moe, torch.float16)
    assert want_skipped and len(want_skipped) < STEPS, "the scale must overflow, then not"
    runs = distlab.run(_train, layout.world_size, args=(layout, config, moe, "fp16"), timeout=300)
    skipped = runs[0][2]
    for rank, _, theirs, _, _ in runs:
        assert theirs == skipped, (name, rank, theirs, skipped)  # every rank, every stage
    certain = first_run(want_skipped)  # the steps whose scale overflows by a wide margin
    assert skipped[: len(certain)] == certain, (name, skipped, want_skipped)
    # near the threshold one more step may overflow in one run and not the other: compare
    # the losses up to the first step where the two runs' skips differ
    same = next((s for s in range(1, STEPS + 1) if (s in skipped) != (s in want_skipped)), STEPS)
    reported = next(losses for _, losses, _, _, _ in runs if losses is not None)
    assert _max_relative(reported[:same], want[:same]) < FP16_RTOL, (name, reported, want)


def first_run(steps: list[int]) -> list[int]:
    """The leading run of consecutive steps: [1, 2, 7, 9] -> [1, 2]."""
    run = steps[:1]
    while len(run) < len(steps) and steps[len(run)] == run[-1] + 1:
        run.append(steps[len(run)])
    return run


def test_precision_and_loss_scaler_are_checked_by_name():
    from distlab.models import GPT
    from distlab.parallel.compose import train
    from distlab.parallel.precision.mixed_precision import DynamicLossScaler

    model, config = GPT(CASES["tp2_cp2_dp2"][1]), CASES["tp2_cp2_dp2"][1]
    tokens, targets = gpt_batch(BATCH, config, seed=1)
    with pytest.raises(ValueError, match="precision must be one of .*got 'fp8'"):
        train(model, Layout(), tokens, targets, steps=1, lr=0.1, precision="fp8")
    with pytest.raises(ValueError, match="loss_scaler is for precision='fp16'"):
        train(model, Layout(), tokens, targets, steps=1, lr=0.1, precision="bf16",
              loss_scaler=DynamicLossScaler())  # fmt: skip


def _fp16_with_checkpoint(rank, world_size, layout, config, steps, options):
    torch.set_num_threads(1)
    from distlab.parallel.compose import train
    from distlab.parallel.precision.mixed_precision import DynamicLossScaler

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    scaler = DynamicLossScaler(FP16_INIT_SCALE, growth_interval=2)  # grows between saves
    run = train(make_model(config, None), layout, tokens, targets, steps=steps, lr=LR,
                optimizer=OPTIMIZER, precision="fp16", loss_scaler=scaler, **options)  # fmt: skip
    return run.losses, run.skipped_steps, run.shards, scaler.state_dict()


@pytest.mark.slow
def test_fp16_resumes_with_the_saved_loss_scale_bit_for_bit(tmp_path):
    """ZeRO-2 (TP2 x DP2) in fp16 saved after step 4, with the scale backed off from 2^20
    and one good step counted towards the next growth (every 2), then resumed for 4 more
    steps: the same losses, skipped steps, parameters and scaler state as the
    uninterrupted run. Without the scaler's state the resumed run would start at 2^20
    again and skip its first steps."""
    layout, config, _ = FP16_CASES["tp2_dp2_zero2"]
    save_after, path = 4, str(tmp_path / "fp16")
    args = (layout, config, 2 * save_after)
    whole = distlab.run(_fp16_with_checkpoint, layout.world_size,
                        args=(*args, {"save_to": path, "save_after": save_after}), timeout=300)  # fmt: skip
    args = (layout, config, save_after, {"resume_from": path})
    resumed = distlab.run(_fp16_with_checkpoint, layout.world_size, args=args, timeout=300)
    assert whole[0][1][:1] == [1], "the first step must overflow at 2^20"
    for (losses, skipped, shards, scaler), (w_losses, w_skipped, w_shards, w_scaler) in zip(
        resumed, whole, strict=True
    ):
        assert losses == w_losses[save_after:]
        assert skipped == [s for s in w_skipped if s > save_after]
        assert scaler == w_scaler
        for name, value in shards.items():
            assert torch.equal(value, w_shards[name]), name
