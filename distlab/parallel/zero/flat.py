"""Flat parameters: many tensors laid end to end in one buffer, cut into K equal shards.

ZeRO and FSDP partition model state between the K data-parallel ranks. They
do it on a *flat* view: the parameters of a group (a bucket for ZeRO, a
wrapped unit for FSDP) are concatenated into one vector of Ψ elements,
padded with zeros to a multiple of K, and rank ``r`` owns elements
``[r*S, (r+1)*S)`` with ``S = ceil(Ψ / K)`` (Rajbhandari et al. 2020,
Section 5; Zhao et al. 2023, "PyTorch FSDP", Section 3.2.1 "FlatParameter").
Equal shards make reduce-scatter and all-gather simple; the price is up to
K-1 padding elements per group.

Every parameter's ``.data`` becomes a view into the flat buffer, so writing
the buffer (an all-gather) updates the model's parameters in place, and the
parameter objects (which autograd and the user hold) never change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class FlatGroup:
    """Offsets of a group of parameters inside a flat, padded, sharded buffer."""

    def __init__(self, params: Sequence[nn.Parameter], rank: int, world_size: int):
        if not params:
            raise ValueError("a flat group needs at least one parameter")
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"a flat group needs one dtype, got {sorted(map(str, dtypes))}")
        self.params = list(params)
        self.shapes = [p.shape for p in params]
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.rank, self.world_size = rank, world_size
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padded_numel = self.shard_numel * world_size
        self.offsets: list[tuple[int, int]] = []
        start = 0
        for p in params:
            self.offsets.append((start, start + p.numel()))
            start += p.numel()

    @property
    def shard_range(self) -> tuple[int, int]:
        """This rank's ``[start, stop)`` in the padded flat buffer."""
        return self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel

    @property
    def owned_numel(self) -> int:
        """How many real (not padding) elements this rank's shard holds."""
        start, stop = self.shard_range
        return max(0, min(stop, self.numel) - start)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's slice of ``flat``, shaped like the parameter."""
        return [flat[a:b].view(shape) for (a, b), shape in zip(self.offsets, self.shapes)]

    def flatten(self, tensors: Sequence[torch.Tensor | None], dtype=None) -> torch.Tensor:
        """A new padded flat tensor of ``tensors`` (``None`` counts as zeros)."""
        flat = torch.zeros(self.padded_numel, dtype=dtype or self.dtype, device=self.device)
        for (a, b), t in zip(self.offsets, tensors):
            if t is not None:
                flat[a:b].copy_(t.reshape(-1))
        return flat

    def shard_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard (a view) of a padded flat tensor."""
        start, stop = self.shard_range
        return flat[start:stop]

    def bind(self, flat: torch.Tensor) -> None:
        """Make every parameter's ``.data`` a view into ``flat`` (same values afterwards)."""
        with torch.no_grad():
            for p, view in zip(self.params, self.views(flat)):
                view.copy_(p.data)
                p.data = view


def named_parameter_index(module: nn.Module) -> dict[int, str]:
    """``id(param) -> name`` (the first name of a tied parameter)."""
    out: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), name)
    return out
