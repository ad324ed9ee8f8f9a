"""The memory formulas against what PyTorch really keeps (CPU, bf16).

* Saved activations: every tensor autograd saves during a GPT block's forward
  is caught with ``torch.autograd.graph.saved_tensors_hooks`` and counted once
  per storage (views of one tensor count once); parameters and buffers are
  model state, not activations, and are left out. The block (distlab.models)
  has the paper's terms, dropout masks included (1-byte bool masks, as CUDA's
  fused dropout keeps), in bf16 as Korthikanti et al. assume 16-bit activations.
  Its only extra is LayerNorm's per-row mean and 1/std (2 numbers per token per
  norm), which the paper leaves out.
* Model states: parameter, gradient and optimizer-state bytes of real
  ``torch.optim`` optimizers after one step, one recipe at a time.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from distlab.calc.memory import activation_bytes_per_layer, model_state_bytes
from distlab.models import MLP, GPTBlock, mlp_batch


def saved_tensor_storages(module, *inputs) -> dict[int, torch.Tensor]:
    """Storages autograd saves for backward while ``module(*inputs)`` runs, by address."""
    model_state = {
        t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())
    }
    saved: dict[int, torch.Tensor] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in model_state:
            saved[ptr] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    out.float().sum().backward()  # the saved tensors really were enough for backward
    return saved


def nbytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


SHAPES = [(16, 2, 64, 4), (32, 1, 128, 8), (64, 2, 64, 2), (8, 4, 256, 8), (24, 3, 96, 6)]


@pytest.mark.parametrize(("s", "b", "h", "a"), SHAPES)
def test_gpt_block_saved_activations_match_korthikanti(s, b, h, a):
    block = GPTBlock(h, a, dropout=0.1, max_seq_len=s).to(torch.bfloat16).train()
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    saved = saved_tensor_storages(block, x)
    measured = nbytes(saved.values())
    formula = activation_bytes_per_layer(seq_len=s, micro_batch=b, hidden=h, heads=a)
    assert measured == pytest.approx(formula, rel=0.05)
    # and exactly, once LayerNorm's statistics (b x s x 1 tensors) are set aside
    stats = [t for t in saved.values() if t.shape == (b, s, 1)]
    assert len(stats) == 4
    assert measured - nbytes(stats) == formula
    masks = [t for t in saved.values() if t.dtype == torch.bool]
    assert nbytes(masks) == a * s * s * b + 2 * s * b * h  # Korthikanti: as²b + sbh + sbh


def test_full_recompute_keeps_only_the_layer_input():
    s, b, h, a = 16, 2, 64, 4
    block = GPTBlock(h, a, dropout=0.1, max_seq_len=s).to(torch.bfloat16).train()

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=True)

    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    saved = saved_tensor_storages(Checkpointed(), x)
    assert nbytes(saved.values()) == activation_bytes_per_layer(
        seq_len=s, micro_batch=b, hidden=h, heads=a, recompute="full"
    )


def _state_bytes(optimizer, like: list[torch.Tensor]) -> int:
    """Bytes of per-parameter optimizer buffers (Adam's m and v, SGD's momentum).
    Adam's ``step`` counters (one scalar per tensor) are not per-parameter state."""
    total = 0
    for p in like:
        for value in optimizer.state[p].values():
            if torch.is_tensor(value) and value.shape == p.shape:
                total += value.numel() * value.element_size()
    return total


def _measure(recipe: str) -> tuple[int, int, int, int]:
    """Train an MLP one step with ``recipe``; return (n_params, param, grad, optimizer bytes)."""
    model = MLP((16, 64, 64, 8), seed=0)
    x, y = mlp_batch(32, 16, 8, seed=1)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    if recipe in ("fp32_adam", "sgd_momentum"):
        opt = (
            torch.optim.Adam(params)
            if recipe == "fp32_adam"
            else torch.optim.SGD(params, lr=0.1, momentum=0.9)
        )
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        optimizer_bytes = _state_bytes(opt, params)
    elif recipe == "bf16_adam":
        model = model.to(torch.bfloat16)
        params = list(model.parameters())
        opt = torch.optim.Adam(params)
        torch.nn.functional.mse_loss(model(x.bfloat16()), y.bfloat16()).backward()
        opt.step()
        optimizer_bytes = _state_bytes(opt, params)
    else:  # mixed_adam: bf16 model, fp32 master copy that Adam updates
        model = model.to(torch.bfloat16)
        params = list(model.parameters())
        master = [p.detach().float().requires_grad_() for p in params]
        opt = torch.optim.Adam(master)
        torch.nn.functional.mse_loss(model(x.bfloat16()), y.bfloat16()).backward()
        for m, p in zip(master, params, strict=True):
            m.grad = p.grad.float()  # transient fp32 gradient, freed after the step
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, params, strict=True):
                m.grad = None
                p.copy_(m)
        optimizer_bytes = nbytes(master) + _state_bytes(opt, master)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params)
    return n, param_bytes, grad_bytes, optimizer_bytes


@pytest.mark.parametrize("recipe", ["mixed_adam", "fp32_adam", "bf16_adam", "sgd_momentum"])
def test_model_state_bytes_match_real_optimizers(recipe):
    n, param_bytes, grad_bytes, optimizer_bytes = _measure(recipe)
    predicted = model_state_bytes(n, recipe=recipe)
    assert (predicted.parameters, predicted.gradients, predicted.optimizer_states) == (
        param_bytes,
        grad_bytes,
        optimizer_bytes,
    )
