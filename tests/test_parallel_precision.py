"""Mixed precision: bf16 with fp32 masters trains like fp32; fp16 needs a dynamic loss scale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distlab.calc.memory import model_state_bytes
from distlab.models import MLP, mlp_batch
from distlab.parallel import (
    DynamicLossScaler,
    MixedPrecisionOptimizer,
    autocast,
    measure_model_state,
)

STEPS = 30


ADAM = (torch.optim.Adam, {"lr": 1e-2})
SGD = (torch.optim.SGD, {"lr": 0.05})  # for comparing weights: see test_parallel_methods on Adam


def _train_fp32(steps=STEPS, optimizer=ADAM):
    model = MLP(seed=0)
    opt = optimizer[0](model.parameters(), **optimizer[1])
    x, y = mlp_batch(32, seed=1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def _train_low(dtype, scaler=None, steps=STEPS, optimizer=ADAM, loss_factor=1.0):
    model = MLP(seed=0).to(dtype)
    opt = MixedPrecisionOptimizer(model, optimizer[0], loss_scaler=scaler, **optimizer[1])
    x, y = mlp_batch(32, seed=1)
    losses, stepped = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x.to(dtype)), y.to(dtype)).float() * loss_factor
        opt.scale_loss(loss).backward()
        stepped.append(opt.step())
        losses.append(loss.item() / loss_factor)
    return model, opt, losses, stepped


def _max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        (p.float() - q.float()).abs().max().item() for p, q in zip(a.parameters(), b.parameters())
    )


def test_bf16_with_fp32_masters_trains_like_fp32():
    """Loosely: the loss curve within 5% (Adam), the weights within 0.01 (SGD).
    Adam's per-weight normalisation lets bf16 rounding steer small-gradient
    weights elsewhere (max 0.26 after 30 steps here) while the loss agrees."""
    _, fp32_losses = _train_fp32()
    _, _, losses, stepped = _train_low(torch.bfloat16)
    assert all(stepped)
    assert losses[-1] < 0.6 * losses[0]
    assert losses[-1] == pytest.approx(fp32_losses[-1], rel=0.05)
    reference, _ = _train_fp32(optimizer=SGD)
    model, _, _, _ = _train_low(torch.bfloat16, optimizer=SGD)
    assert _max_difference(model, reference) < 0.01  # bf16 keeps 8 significant bits


def _train_autocast(optimizer):
    model = MLP(seed=0)  # fp32 weights are the masters; matmuls run in bf16
    opt = optimizer[0](model.parameters(), **optimizer[1])
    x, y = mlp_batch(32, seed=1)
    for _ in range(STEPS):
        opt.zero_grad()
        with autocast("cpu", torch.bfloat16):
            out = model(x)
        assert out.dtype == torch.bfloat16
        loss = F.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
    return model, loss.item()


def test_bf16_autocast_trains_like_fp32():
    _, fp32_losses = _train_fp32()
    _, loss = _train_autocast(ADAM)
    assert loss == pytest.approx(fp32_losses[-1], rel=0.05)
    reference, _ = _train_fp32(optimizer=SGD)
    model, _ = _train_autocast(SGD)
    assert _max_difference(model, reference) < 0.01


def test_without_master_weights_small_updates_round_away():
    """lr * grad is far below half a bf16 ulp of a weight: pure bf16 rounds each update
    away and barely moves; fp32 masters accumulate the updates until they show."""
    x, y = mlp_batch(32, seed=1)
    pure = MLP(seed=0).to(torch.bfloat16)
    start = [p.detach().clone() for p in pure.parameters()]
    sgd = torch.optim.SGD(pure.parameters(), lr=1e-4)
    master_model = MLP(seed=0).to(torch.bfloat16)
    masters = MixedPrecisionOptimizer(master_model, torch.optim.SGD, lr=1e-4)
    for _ in range(300):
        for model, opt in ((pure, sgd), (master_model, masters)):
            opt.zero_grad()
            F.mse_loss(model(x.bfloat16()), y.bfloat16()).backward()
            opt.step()
    moved_pure = sum(int((p != s).sum()) for p, s in zip(pure.parameters(), start))
    moved_masters = sum(int((p != s).sum()) for p, s in zip(master_model.parameters(), start))
    total = sum(p.numel() for p in start)
    assert moved_pure < 0.01 * total
    assert moved_masters > max(0.1 * total, 10 * moved_pure)


def test_fp16_gradients_underflow_to_zero_without_loss_scaling():
    x, y = mlp_batch(32, seed=1)
    grads = {}
    for name, scale in (("unscaled", 1.0), ("scaled", 2.0**16)):
        model = MLP(seed=0).half()
        loss = F.mse_loss(model(x.half()), y.half()).float() * 1e-6  # gradients ~1e-8 .. 1e-7
        (loss * scale).backward()
        grads[name] = torch.cat([p.grad.float().flatten() for p in model.parameters()]) / scale
    exact_model = MLP(seed=0)
    (F.mse_loss(exact_model(x), y) * 1e-6).backward()
    exact = torch.cat([p.grad.flatten() for p in exact_model.parameters()])
    assert grads["unscaled"].count_nonzero() == 0  # every gradient flushed to zero
    assert gradient_cosine(grads["scaled"], exact) > 0.999


def gradient_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def test_fp16_overflows_to_nan_with_a_fixed_large_scale_and_recovers_with_a_dynamic_one():
    # A fixed scale of 2^24 pushes the scaled gradients past fp16's 65504: inf, then NaN weights.
    fixed, _, _, stepped = _train_low(torch.float16, scaler=2.0**24, steps=5)
    assert all(stepped)
    assert not all(torch.isfinite(p).all() for p in fixed.parameters())
    # The dynamic scaler skips those steps and halves the scale until the gradients fit.
    scaler = DynamicLossScaler(2.0**24, growth_interval=1000)
    model, _, losses, stepped = _train_low(torch.float16, scaler=scaler, steps=STEPS)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert scaler.skipped_steps == stepped.count(False) >= 1
    assert scaler.scale == 2.0**24 * 0.5**scaler.skipped_steps
    assert losses[-1] < 0.6 * losses[0]
    _, fp32_losses = _train_fp32(steps=STEPS - scaler.skipped_steps)
    assert losses[-1] == pytest.approx(fp32_losses[-1], rel=0.05)


def test_in_training_the_dynamic_scale_grows_while_stable_and_halves_on_overflow():
    """Start at a safe scale that grows every 3 good steps: it climbs until the
    scaled gradients overflow fp16, that step is skipped and the scale halves."""
    model = MLP(seed=0).half()
    scaler = DynamicLossScaler(2.0**8, growth_interval=3)
    opt = MixedPrecisionOptimizer(model, torch.optim.Adam, loss_scaler=scaler, lr=1e-2)
    x, y = mlp_batch(32, seed=1)
    scales, stepped = [], []
    for _ in range(60):
        opt.zero_grad()
        loss = F.mse_loss(model(x.half()), y.half()).float()
        opt.scale_loss(loss).backward()
        stepped.append(opt.step())
        scales.append(scaler.scale)
    grew = [i for i in range(1, 60) if scales[i] == 2 * scales[i - 1]]
    halved = [i for i in range(1, 60) if scales[i] == scales[i - 1] / 2]
    assert grew and halved and min(grew) < min(halved)
    assert [i for i in range(60) if not stepped[i]] == halved  # exactly the skipped steps
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_dynamic_scaler_grows_after_a_run_of_good_steps_and_backs_off_on_overflow():
    scaler = DynamicLossScaler(8.0, growth_interval=3)
    for _ in range(3):
        scaler.update(found_inf=False)
    assert scaler.scale == 16.0
    scaler.update(found_inf=True)
    assert scaler.scale == 8.0 and scaler.good_steps == 0 and scaler.skipped_steps == 1
    with pytest.raises(ValueError, match="growth_interval"):
        DynamicLossScaler(growth_interval=0)


def test_mixed_precision_memory_matches_the_mixed_adam_recipe():
    model, opt, _, _ = _train_low(torch.bfloat16, steps=1)
    n = sum(p.numel() for p in model.parameters())
    measured = measure_model_state(model, opt)
    expected = model_state_bytes(n, recipe="mixed_adam")
    assert (measured.parameters, measured.gradients, measured.optimizer_states) == (
        expected.parameters,
        expected.gradients,
        expected.optimizer_states,
    )
    assert measured.optimizer_step_counters == 4 * len(
        opt.masters
    )  # Adam's float32 step per tensor


def test_a_fp32_model_is_refused_and_cuda_is_only_used_when_present():
    with pytest.raises(ValueError, match="bf16/fp16 model"):
        MixedPrecisionOptimizer(MLP(seed=0))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            autocast("cuda")


def test_train_step_multiplies_the_loss_by_the_scalers_scale():
    """training.train_step with a loss-scaled optimizer does what the hand-written loop does."""
    from distlab.parallel.data import training as T

    batches = [mlp_batch(16, seed=s) for s in range(4)]
    trainer = T.build(
        "single",
        MLP(seed=0).half(),
        loss_scaler=DynamicLossScaler(2.0**8, growth_interval=2),
        lr=1e-2,
    )
    for batch in batches:
        T.train_step(trainer, batch, T.mse_loss)
    model = MLP(seed=0).half()
    scaler = DynamicLossScaler(2.0**8, growth_interval=2)
    opt = MixedPrecisionOptimizer(model, loss_scaler=scaler, lr=1e-2)
    for batch in batches:
        opt.zero_grad()
        opt.scale_loss(T.mse_loss(model, batch)).backward()
        opt.step()
    assert trainer.optimizer.loss_scaler.scale == scaler.scale == 2.0**10
    for p, q in zip(trainer.model.parameters(), model.parameters()):
        assert torch.equal(p, q)


def test_any_object_with_scale_and_update_is_a_loss_scaler():
    """A student's own scaler plugs in: it gets the same trajectory as DynamicLossScaler."""

    class HalvingScaler:  # written from scratch, no distlab base class
        def __init__(self):
            self.scale, self.good = 2.0**16, 0

        def update(self, found_inf):
            if found_inf:
                self.scale, self.good = self.scale / 2, 0
            else:
                self.good += 1
                if self.good == 2000:
                    self.scale, self.good = self.scale * 2, 0

    mine = _train_low(torch.float16, scaler=HalvingScaler(), steps=10)
    library = _train_low(torch.float16, scaler=DynamicLossScaler(), steps=10)
    assert mine[2:] == library[2:]  # the same losses and skipped steps
    with pytest.raises(TypeError, match="update\\(found_inf\\)"):
        MixedPrecisionOptimizer(MLP(seed=0).half(), loss_scaler="dynamic")


def test_a_model_with_sharded_gradients_decides_the_overflow_for_every_rank():
    """FSDP offers any_rank(found_inf): an overflow on another rank's shard skips the
    step here too, though this rank's own gradients are finite."""
    x, y = mlp_batch(32, seed=1)
    for others_overflowed in (True, False):
        model = MLP(seed=0).half()
        model.any_rank = lambda found_inf, other=others_overflowed: found_inf or other
        scaler = DynamicLossScaler(2.0**8)
        opt = MixedPrecisionOptimizer(model, loss_scaler=scaler, lr=1e-2)
        opt.scale_loss(F.mse_loss(model(x.half()), y.half()).float()).backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        assert opt.step() is not others_overflowed
        assert scaler.skipped_steps == int(others_overflowed)


def test_a_loss_scalers_state_round_trips_and_a_missing_key_is_named():
    from distlab.parallel.precision.mixed_precision import DynamicLossScaler

    scaler = DynamicLossScaler(2.0**10, growth_interval=3)
    for found_inf in (True, False, False):
        scaler.update(found_inf)
    other = DynamicLossScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == scaler.state_dict() == {
        "scale": 2.0**9, "good_steps": 2, "skipped_steps": 1, "growth_factor": 2.0,
        "backoff_factor": 0.5, "growth_interval": 3,
    }  # fmt: skip
    other.update(False)  # the third good step in a row: grows, as the original would
    assert other.scale == 2.0**10
    with pytest.raises(ValueError, match=r"needs \['good_steps'\]"):
        other.load_state_dict({k: v for k, v in scaler.state_dict().items() if k != "good_steps"})
