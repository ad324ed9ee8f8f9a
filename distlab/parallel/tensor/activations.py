"""Measure the activations autograd keeps for backward, per rank.

Every tensor saved during a forward pass goes through
``torch.autograd.graph.saved_tensors_hooks``; counting each storage once
(views of one tensor share it) and leaving out parameters and buffers (model
state, not activations) gives the bytes Korthikanti et al. 2022 count in
Section 4 and Table 2. LayerNorm also saves a per-token mean and 1/std
(``(b, s, 1)`` tensors), which the paper leaves out; they are reported apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SavedActivations:
    """Bytes saved for backward: ``paper`` (the terms Korthikanti et al. count)
    plus ``layernorm_stats``; ``.total`` is both."""

    paper: int
    layernorm_stats: int
    tensors: int

    @property
    def total(self) -> int:
        return self.paper + self.layernorm_stats


def measure_saved_activations(
    module: torch.nn.Module, forward: Callable[[], torch.Tensor]
) -> tuple[torch.Tensor, SavedActivations]:
    """Run ``forward()`` (which calls ``module``) and count what autograd saves.

    Returns the output and a :class:`SavedActivations`.
    """
    model_state = {
        t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers())
    }
    saved: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in model_state:
            saved[ptr] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    stats = sum(
        t.untyped_storage().nbytes() for t in saved.values() if t.dim() == 3 and t.shape[-1] == 1
    )
    total = sum(t.untyped_storage().nbytes() for t in saved.values())
    return out, SavedActivations(total - stats, stats, len(saved))
