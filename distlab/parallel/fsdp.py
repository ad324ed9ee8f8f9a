"""Fully sharded data parallel (FSDP, ZeRO stage 3): each rank keeps 1/K of the parameters.

The model is cut into *units* (the wrapping policy: one per layer, or the
whole model as one). Each unit's parameters are flattened and sharded K ways
(:mod:`distlab.parallel.flat`); between uses, a rank holds only its shard.
Per unit and step (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling
Fully Sharded Data Parallel", Section 3.2; Rajbhandari et al. 2020,
Section 5.3):

1. before the unit's forward: **all-gather** the full parameters;
2. after its forward: **free** them (keep only the shard);
3. before its backward: **all-gather** them again;
4. when all its gradients exist: **reduce-scatter** them, so each rank keeps
   the averaged gradient of its own shard, and **free** the full parameters.

So at any moment a rank holds its shards plus about one unit's full
parameters; per step it moves 3Ψ(K-1)/K elements (two all-gathers and one
reduce-scatter), 1.5 times DDP's 2Ψ(K-1)/K.

Freeing keeps the tensors: the flat buffer's *storage* is resized to zero
bytes and back (as PyTorch FSDP does), so the parameter objects, and the
views autograd saved for backward, stay valid and see the data again once
it is re-gathered. Before-backward is a hook on the unit's output tensors;
after-backward is :class:`~distlab.parallel.buckets.ReadyInOrder` over each
unit's parameters, units in reverse order.

``prefetch=True`` starts the all-gather of the next unit (in the order the
previous step ran them, forward and then backward) on the communication
thread while the current unit computes. All collectives of a rank go through
that one thread, in the same order on every rank.

The optimizer trains the shards: build it with ``fsdp.parameters()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future

import torch
from torch import nn

from .buckets import ReadyInOrder
from .comm import Collectives, CommThread, broadcast_module_state
from .flat import FlatGroup
from .memory import storage_bytes

WRAP_POLICIES = ("layer", "model")


def choose_units(module: nn.Module, wrap) -> list[tuple[str, nn.Module]]:
    """The (name, module) units of a wrapping policy, root first, in module order.

    * ``"model"``: the whole model is one unit;
    * ``"layer"``: every module that owns parameters directly (a Linear, an
      Embedding, a LayerNorm, ...) is a unit;
    * a tuple of module classes (e.g. ``(GPTBlock,)``): each instance is a unit.

    The model itself is always a unit too, for the parameters no other unit
    takes, such as a weight tied between two layers (see :func:`owner_of`).
    """
    if wrap == "model":
        chosen = []
    elif wrap == "layer":
        chosen = [
            (n, m)
            for n, m in module.named_modules()
            if n and any(True for _ in m.parameters(recurse=False))
        ]
    elif isinstance(wrap, tuple) and wrap and all(isinstance(c, type) for c in wrap):
        chosen = [(n, m) for n, m in module.named_modules() if n and isinstance(m, wrap)]
    else:
        raise ValueError(
            f"wrap must be one of {WRAP_POLICIES} or a tuple of module classes, got {wrap!r}"
        )
    return [("", module), *chosen]


def _inside(path: str, unit: str) -> bool:
    return unit == "" or path == unit or path.startswith(unit + ".")


def owner_of(module: nn.Module, unit_names: list[str]) -> dict[int, str]:
    """``id(param) -> name of its unit``: the innermost unit that contains every
    place the parameter is used. A tied weight (GPT's embedding and head) goes
    to a unit enclosing both, often the root, which then stays gathered for the
    whole forward."""
    places: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            places.setdefault(id(p), []).append(name.rpartition(".")[0])
    innermost_first = sorted(unit_names, key=len, reverse=True)
    return {
        pid: next(u for u in innermost_first if all(_inside(q, u) for q in paths))
        for pid, paths in places.items()
    }


class _Unit:
    """One wrapped module: its flat group, the gathered buffer, and this rank's shard."""

    def __init__(self, name: str, module: nn.Module, params: list[nn.Parameter], rank: int, k: int):
        self.name, self.module = name, module
        self.group = FlatGroup(params, rank, k)
        self.full = torch.zeros(
            self.group.padded_numel, dtype=self.group.dtype, device=self.group.device
        )
        self.group.bind(self.full)
        self.shard = nn.Parameter(self.group.shard_of(self.full).clone())
        self.full_bytes = self.full.numel() * self.full.element_size()
        self.pending: Future | None = None  # a prefetched all-gather
        self.free()

    @property
    def params(self) -> list[nn.Parameter]:
        return self.group.params

    @property
    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def free(self) -> None:
        self.full.untyped_storage().resize_(0)


class FSDP(nn.Module):
    """ZeRO-3 / FSDP around ``module``; see the module docstring.

    ``peak_materialised_bytes``: the most bytes of parameters (shards plus
    gathered units, summed over the storages) this rank held at once; at most
    the shards plus the largest unit without prefetch, plus two units with it.
    ``prefetched_gathers`` counts the all-gathers that prefetch started early
    and a unit then used.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        wrap="layer",
        algorithm: str = "ring",
        group=None,
        prefetch: bool = False,
    ):
        super().__init__()
        self.module = module
        self.comm = Collectives(algorithm, group)
        broadcast_module_state(module, self.comm)
        self.prefetch = prefetch
        self.units = self._build_units(choose_units(module, wrap))
        for unit in self.units:
            unit.module.register_forward_pre_hook(lambda m, a, u=unit: self._before_forward(u))
            unit.module.register_forward_hook(lambda m, a, out, u=unit: self._after_forward(u, out))
        self._tracker = ReadyInOrder(
            [u.params for u in reversed(self.units)], self._after_backward, self._finish
        )
        self._thread = CommThread()
        self._reductions: list[Future] = []
        self._order: list[_Unit] = []  # units in the order this step's forward ran them
        self._last_order: list[_Unit] = []
        self.peak_materialised_bytes = self.materialised_bytes()
        self.prefetched_gathers = 0  # all-gathers started ahead by prefetch, then used

    def _build_units(self, chosen: list[tuple[str, nn.Module]]) -> list[_Unit]:
        owner = owner_of(self.module, [name for name, _ in chosen])
        units = []
        for name, m in chosen:
            params, seen = [], set()
            for p in m.parameters():
                if owner.get(id(p)) == name and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
            if params:
                units.append(_Unit(name, m, params, self.comm.rank, self.comm.world_size))
        return units

    # ----------------------------------------------------------- gathering ----
    def materialised_bytes(self) -> int:
        """Bytes of parameters this rank holds now: all shards plus gathered units."""
        return storage_bytes([u.shard for u in self.units] + [u.full for u in self.units])

    def _all_gather(self, unit: _Unit) -> None:  # runs on the communication thread
        if unit.gathered:
            return
        unit.full.untyped_storage().resize_(unit.full_bytes)
        with torch.no_grad():
            self.comm.all_gather(unit.full, unit.shard.detach())
        self.peak_materialised_bytes = max(self.peak_materialised_bytes, self.materialised_bytes())

    def _gather(self, unit: _Unit) -> None:
        """Make ``unit``'s full parameters available (waiting for a prefetch if one runs)."""
        pending, unit.pending = unit.pending, None
        if pending is not None:
            pending.result()
            self.prefetched_gathers += 1
        self._thread.run(lambda: self._all_gather(unit))

    def _prefetch(self, unit: _Unit, step: int) -> None:
        """Start gathering the unit that ran ``step`` places after ``unit`` last time."""
        if not self.prefetch or unit not in self._last_order:
            return
        i = self._last_order.index(unit) + step
        if 0 <= i < len(self._last_order):
            nxt = self._last_order[i]
            if not nxt.gathered and nxt.pending is None:
                nxt.pending = self._thread.submit(lambda: self._all_gather(nxt))

    # --------------------------------------------------------------- hooks ----
    def _before_forward(self, unit: _Unit) -> None:
        if torch.is_grad_enabled():
            self._order.append(unit)
        self._gather(unit)
        self._prefetch(unit, +1)

    def _after_forward(self, unit: _Unit, output) -> None:
        unit.free()
        if torch.is_grad_enabled():
            outputs = output if isinstance(output, (tuple, list)) else [output]
            for out in outputs:
                if isinstance(out, torch.Tensor) and out.requires_grad:
                    out.register_hook(lambda grad, u=unit: self._before_backward(u))

    def _before_backward(self, unit: _Unit) -> None:
        self._gather(unit)
        self._prefetch(unit, -1)

    def _after_backward(self, index: int) -> None:
        unit = self.units[len(self.units) - 1 - index]
        flat_grad = unit.group.flatten([p.grad for p in unit.params])
        for p in unit.params:
            p.grad = None

        def reduce_scatter() -> None:
            out = torch.empty(
                unit.group.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device
            )
            self.comm.reduce_scatter_mean(out, flat_grad)
            if unit.shard.grad is None:
                unit.shard.grad = out
            else:
                unit.shard.grad.add_(out)  # gradient accumulation over micro-batches
            unit.free()

        self._reductions.append(self._thread.submit(reduce_scatter))

    def _finish(self) -> None:
        reductions, self._reductions = self._reductions, []
        for future in reductions:
            future.result()
        for unit in self.units:
            unit.free()
        self._thread.close()
        self._last_order, self._order = self._order, []

    # ------------------------------------------------------------- module ----
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        """The shards this rank trains (what the optimizer must be built on)."""
        for i, unit in enumerate(self.units):
            yield f"{prefix}unit{i}.{unit.name or 'root'}.flat_shard", unit.shard

    @property
    def flat_groups(self) -> list[FlatGroup]:
        return [u.group for u in self.units]

    @property
    def masters(self) -> list[nn.Parameter]:
        """The tensors the optimizer updates, one per flat group (here: the shards)."""
        return [u.shard for u in self.units]

    def after_load(self) -> None:
        """Nothing to do: the shards are the parameters (checkpoint loading hook)."""

    def model_state_tensors(self) -> dict[str, list]:
        """Shards (and any gathered units) and their gradients (see :mod:`distlab.parallel.memory`)."""
        return {
            "parameters": [u.shard for u in self.units] + [u.full for u in self.units],
            "gradients": [u.shard.grad for u in self.units],
        }

    def zero_grad(self, set_to_none: bool = True) -> None:
        for unit in self.units:
            unit.shard.grad = None
