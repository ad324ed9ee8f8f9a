"""Measure the bytes of model state a rank really holds.

The ZeRO paper's model states (Rajbhandari et al. 2020, Section 3.1) are
parameters, gradients and optimizer states (with an fp32 master copy of the
weights counted as optimizer state). Here they are *measured*: the bytes of
every distinct storage behind the tensors a rank holds, each storage counted
once (a view into a flat buffer costs nothing extra; the buffer is counted
whole, padding included). Compare with
:func:`distlab.calc.memory.model_state_bytes`.

Optimizers' step counters (Adam keeps one 0-dimensional tensor per parameter
tensor) are reported apart: a few bytes per *tensor*, not per parameter,
which the per-parameter formulas leave out.

Every data-parallel wrapper in :mod:`distlab.parallel` has a
``model_state_tensors()`` method saying which tensors are which; for a plain
module and a torch optimizer, :func:`measure_model_state` works it out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


def _storage_key(t: torch.Tensor) -> tuple:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr(), storage.nbytes())


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (``None`` is skipped)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is not None and t.untyped_storage().nbytes():
            seen.setdefault(_storage_key(t), t.untyped_storage().nbytes())
    return sum(seen.values())


@dataclass(frozen=True)
class MeasuredModelState:
    """Bytes one rank holds; ``.total`` leaves out the step counters (see module docstring)."""

    parameters: int
    gradients: int
    optimizer_states: int
    optimizer_step_counters: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> tuple[list, list]:
    """(per-element state tensors, 0-dimensional step counters) of a torch optimizer."""
    states, counters = [], []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                (counters if value.dim() == 0 else states).append(value)
    return states, counters


def plain_model_state_tensors(module: torch.nn.Module, optimizer=None) -> dict[str, list]:
    """Which tensors are parameters, gradients and optimizer state, for a plain module."""
    params = list(module.parameters())
    states, counters = optimizer_state_tensors(optimizer) if optimizer is not None else ([], [])
    return {
        "parameters": params,
        "gradients": [p.grad for p in params],
        "optimizer_states": states,
        "optimizer_step_counters": counters,
    }


def measure_model_state(model, optimizer=None) -> MeasuredModelState:
    """Measure a rank's model state.

    ``model`` and ``optimizer`` are what the training loop uses: a plain
    module or a distlab wrapper (DDP, FSDP) and a torch optimizer or a
    distlab one (ZeRO, mixed precision). The object that knows the layout
    (``model_state_tensors()``) is asked; a storage listed under two
    categories is counted in the first (parameters, then gradients, then
    optimizer states).
    """
    owner = next((o for o in (optimizer, model) if hasattr(o, "model_state_tensors")), None)
    if owner is not None:
        groups = owner.model_state_tensors()
        if owner is model and optimizer is not None:
            states, counters = optimizer_state_tensors(optimizer)
            groups = {
                **groups,
                "optimizer_states": groups.get("optimizer_states", []) + states,
                "optimizer_step_counters": counters,
            }
    else:
        groups = plain_model_state_tensors(model, optimizer)
    seen: set[tuple] = set()
    sizes = {}
    for name in ("parameters", "gradients", "optimizer_states", "optimizer_step_counters"):
        fresh = []
        for t in groups.get(name, []):
            if t is not None and t.untyped_storage().nbytes() and _storage_key(t) not in seen:
                seen.add(_storage_key(t))
                fresh.append(t)
        sizes[name] = storage_bytes(fresh)
    return MeasuredModelState(**sizes)
