"""The single-GPU paths, on CUDA: 16-bit training and model-state memory against the calculator.

Skipped without a CUDA GPU (the default CI is CPU only). On a GPU the memory is
read from PyTorch's caching allocator: ``torch.cuda.memory_allocated`` counts
every live tensor rounded up to the allocator's 512-byte blocks, so after a
step it must lie between the calculator's bytes and that plus 512 bytes per
tensor of model state; ``max_memory_allocated`` adds the step's activations
and temporaries on top.
"""

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

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SIZES = (256, 1024, 1024, 256)
BLOCK = 512  # bytes: the CUDA caching allocator's rounding


def _data(dtype=torch.float32):
    x, y = mlp_batch(64, SIZES[0], SIZES[-1], seed=1)
    return x.cuda().to(dtype), y.cuda().to(dtype)


def _losses(model, opt, dtype, steps, *, use_autocast=False):
    x, y = _data(dtype if not use_autocast else torch.float32)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        if use_autocast:
            with autocast("cuda", dtype):
                out = model(x)
            assert out.dtype == dtype
        else:
            out = model(x)
        loss = F.mse_loss(out.float(), y.float())
        (opt.scale_loss(loss) if hasattr(opt, "scale_loss") else loss).backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_bf16_and_fp16_on_cuda_train_like_fp32():
    steps = 30
    model = MLP(SIZES, seed=0).cuda()
    fp32 = _losses(model, torch.optim.Adam(model.parameters(), lr=1e-3), torch.float32, steps)
    model = MLP(SIZES, seed=0).cuda()
    bf16_autocast = _losses(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        torch.bfloat16,
        steps,
        use_autocast=True,
    )
    model = MLP(SIZES, seed=0).cuda().half()
    scaler = DynamicLossScaler(2.0**16, growth_interval=10)
    fp16 = _losses(
        model, MixedPrecisionOptimizer(model, loss_scaler=scaler, lr=1e-3), torch.float16, steps
    )
    assert fp32[-1] < 0.6 * fp32[0]
    assert bf16_autocast[-1] == pytest.approx(fp32[-1], rel=0.05)
    assert fp16[-1] == pytest.approx(fp32[-1], rel=0.05)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("recipe", ["fp32_adam", "mixed_adam"])
def test_cuda_allocator_sees_the_calculators_model_state(recipe):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    x, y = _data()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model = MLP(SIZES, seed=0).cuda()
    if recipe == "fp32_adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        model = model.bfloat16()
        opt = MixedPrecisionOptimizer(model, lr=1e-3)
    opt.zero_grad()
    F.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y).backward()
    opt.step()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    n = sum(p.numel() for p in model.parameters())
    expected = model_state_bytes(n, recipe=recipe).total
    measured = measure_model_state(model, opt)
    assert measured.total == expected  # the storages the model and optimizer hold
    tensors = len(list(model.parameters())) * (4 if recipe == "fp32_adam" else 5)
    assert expected <= allocated <= expected + BLOCK * tensors, (allocated, expected)
    assert peak >= allocated
    print(f"{recipe}: calculator {expected:,} B, allocated {allocated:,} B, peak {peak:,} B")
