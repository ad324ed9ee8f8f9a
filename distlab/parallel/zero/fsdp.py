"""Fully sharded data parallel (FSDP, ZeRO stage 3): each rank keeps 1/K of the parameters.

The model is cut into *units* (the wrapping policy: one per layer, or the
whole model as one). Each unit's parameters are flattened and sharded K ways
(:mod:`distlab.parallel.zero.flat`); between uses, a rank holds only its shard.
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
after-backward is :class:`~distlab.parallel.comm.buckets.ReadyInOrder` over each
unit's parameters, units in reverse order.

``prefetch=True`` starts the all-gather of the next unit (in the order the
previous step ran them, forward and then backward) on the communication
thread while the current unit computes. All collectives of a rank go through
that one thread, in the same order on every rank.

The optimizer trains the shards: build it with ``fsdp.parameters()``.

**Mixed precision** (``mixed_precision=MixedPrecisionPolicy(param_dtype,
reduce_dtype)``), as PyTorch's FSDP2 does it (Zhao et al. 2023, Section 3.2.3 for
FSDP's mixed precision; Micikevicius et al. 2018, Section 3): the sharded
parameters stay in the model's dtype (fp32) and *are* the master weights; each
all-gather casts this rank's shard to ``param_dtype`` first, so the gathered
weights, the forward and the backward are 16-bit and the gathers move half the
bytes; the gradients are reduce-scattered in ``reduce_dtype`` and the result is
cast to the shard's dtype. A plain torch optimizer, built on ``fsdp.parameters()``,
steps fp32 shards. Per rank that is the ``fp32_adam`` recipe at ZeRO stage 3,
(4 + 4 + 8)Ψ/K bytes, the same 16Ψ/K as the ZeRO paper's mixed-precision count
(2 + 2 + 12)Ψ/K split another way: here the master is the parameter, there it is
optimizer state; plus one unit's gathered 16-bit weights while it computes.
For fp16 a loss scale is still needed (gradients below 2^-24 flush to zero in the
16-bit backward): a :class:`~distlab.parallel.precision.mixed_precision.MixedPrecisionOptimizer`
with a ``DynamicLossScaler``, built on the FSDP model, steps the fp32 shards in place
and asks :meth:`FSDP.any_rank` whether any rank overflowed (a rank sees only its
shard's gradients), so all ranks skip the same steps.

A model cast to 16 bits *before* wrapping, with no policy, has 16-bit shards: a
plain optimizer then trains them directly (the ``bf16_adam`` recipe, whose updates
below half an ulp round away), and a ``MixedPrecisionOptimizer`` keeps fp32 copies
of them (``mixed_adam``, the paper's split; its masters start from the 16-bit
weights). The policy is the better way to the same 16 bytes: the masters start from
the fp32 weights themselves.

**Gradients by name.** After backward the wrapped module's ``param.grad``
is ``None`` (its full weights are freed) and two forms give the gradients:

* :meth:`FSDP.named_gradients` maps each parameter name to this rank's part
  of its gradient (a 1-D view into the shard's gradient, elements
  :meth:`FSDP.shard_range` of the flattened parameter; empty where the rank
  owns none), like FSDP2's sharded gradients;
* :meth:`FSDP.gather_gradients` (collective) all-gathers them, so that every
  wrapped parameter's ``.grad`` holds its full gradient, on every rank, as
  with DDP: code written for ``param.grad`` (clipping by hand, gradient
  checks, logging per parameter) works unchanged, and what it writes into
  ``.grad`` is what the optimizer steps. The full gradients cost Ψ elements
  per rank until the next forward or ``zero_grad()`` drops them.

:meth:`FSDP.clip_grad_norm_` clips across the shards without gathering: each
rank adds up its own part of the norm, one all-gather shares the K partial
sums, and every rank scales its gradients by the same factor.

**Bitwise parity.** In fp32 on two ranks FSDP's parameters equal DDP's bit
for bit, and both equal single-process training that takes the two ranks'
halves of the batch as two accumulated micro-batches (loss / 2 each): with
two ranks the reduce-scatter adds the same two numbers as DDP's all-reduce
(a + b == b + a) and halves exactly, as accumulation does. Neither equals
single-process training on the *whole* batch: one matmul over B samples
sums them in another order than two matmuls over B/2 added afterwards
(measured on the MLP, batch 24, one step: 1.9e-9 with SGD at lr 0.05,
1.5e-8 with Adam at lr 1e-2, for DDP and FSDP alike; that 1.5e-8 is DDP's
too). With K >= 3 ranks the sum of K terms depends on where the ring
starts for each element, which differs between DDP's chunks and FSDP's
shards: equal to rounding only (``tests/test_parallel_fsdp.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future

import torch
from torch import nn

from distlab.collectives.buffers import Group
from distlab.parallel.comm.buckets import ReadyInOrder
from distlab.parallel.comm.collectives import Collectives, CommThread, broadcast_module_state
from distlab.parallel.precision.memory import storage_bytes
from distlab.parallel.precision.mixed_precision import MixedPrecisionPolicy
from distlab.parallel.zero.flat import FlatGroup, named_parameter_index

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


def _weights_dtype(module: nn.Module) -> torch.dtype:
    """The one dtype of the trainable weights (``ValueError`` if they mix dtypes)."""
    dtypes = {p.dtype for p in module.parameters() if p.requires_grad}
    if len(dtypes) != 1:
        raise ValueError(f"FSDP needs one dtype for all weights, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    """One wrapped module: its flat group, the gathered buffer, and this rank's shard.

    The shard keeps the weights' own dtype (the master, fp32 under a policy); the
    gathered buffer, which the module's parameters are views into, is ``compute_dtype``."""

    def __init__(self, name, module, params: list[nn.Parameter], rank: int, k: int, compute_dtype):
        self.name, self.module = name, module
        self.group = FlatGroup(params, rank, k)
        flat = self.group.flatten([p.detach() for p in params])  # the weights as given
        self.shard = nn.Parameter(self.group.shard_of(flat).clone())
        self.full = torch.zeros(self.group.padded_numel, dtype=compute_dtype, device=flat.device)
        self.group.bind(self.full)  # the parameters become compute_dtype views into it
        self.full_bytes = self.full.numel() * self.full.element_size()
        self.pending: Future | None = None  # a prefetched all-gather
        self.full_grad: torch.Tensor | None = None  # gathered by FSDP.gather_gradients
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
    and a unit then used. ``mixed_precision``: a
    :class:`~distlab.parallel.precision.mixed_precision.MixedPrecisionPolicy` (``None``:
    compute and reduce in the model's own dtype).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        wrap="layer",
        algorithm: str = "ring",
        group: Group = None,
        prefetch: bool = False,
        mixed_precision: MixedPrecisionPolicy | None = None,
    ):
        super().__init__()
        if mixed_precision is None:
            mixed_precision = MixedPrecisionPolicy()
        if not isinstance(mixed_precision, MixedPrecisionPolicy):
            raise TypeError(
                f"mixed_precision must be a MixedPrecisionPolicy or None, got {mixed_precision!r}"
            )
        self.module = module
        self.comm = Collectives(algorithm, group)
        broadcast_module_state(module, self.comm)
        self.shard_dtype = _weights_dtype(module)  # what the optimizer steps
        self.param_dtype = mixed_precision.param_dtype or self.shard_dtype  # gathers, compute
        self.reduce_dtype = mixed_precision.reduce_dtype or self.param_dtype
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
        self._slices = self._parameter_slices()

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
                units.append(
                    _Unit(name, m, params, self.comm.rank, self.comm.world_size, self.param_dtype)
                )
        return units

    # ----------------------------------------------------------- gathering ----
    def materialised_bytes(self) -> int:
        """Bytes of parameters this rank holds now: all shards plus gathered units."""
        return storage_bytes([u.shard for u in self.units] + [u.full for u in self.units])

    def _all_gather(self, unit: _Unit) -> None:  # runs on the communication thread
        if unit.gathered:
            return
        unit.full.untyped_storage().resize_(unit.full_bytes)
        with torch.no_grad():  # the shard cast to param_dtype first: 16-bit gathers
            self.comm.all_gather(unit.full, unit.shard.detach().to(unit.full.dtype))
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
        flat_grad = unit.group.flatten([p.grad for p in unit.params], dtype=self.reduce_dtype)
        for p in unit.params:
            p.grad = None

        def reduce_scatter() -> None:
            out = torch.empty(
                unit.group.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device
            )
            self.comm.reduce_scatter_mean(out, flat_grad)
            out = out.to(unit.shard.dtype)  # reduce_dtype -> the shard's (master) dtype
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
        """The module's forward; floating-point tensor inputs are cast to the weights' dtype.

        Full gradients from :meth:`gather_gradients` are dropped first (this rank keeps
        its part), so a next backward accumulates into the shards, not into them."""
        self._drop_full_gradients()
        args = tuple(self._cast_input(a) for a in args)
        kwargs = {k: self._cast_input(v) for k, v in kwargs.items()}
        return self.module(*args, **kwargs)

    def _cast_input(self, value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(self.param_dtype)
        return value

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
        """This rank's shards, one per flat group: what a torch optimizer updates (fp32
        under a policy). A ``MixedPrecisionOptimizer`` on 16-bit shards (a model cast
        before wrapping) updates fp32 copies instead and rounds back (see
        :class:`~distlab.parallel.checkpoint.data_parallel.FSDPMasters`)."""
        return [u.shard for u in self.units]

    def after_load(self) -> None:
        """Nothing to do: the shards are the parameters (checkpoint loading hook)."""

    def model_state_tensors(self) -> dict[str, list]:
        """Shards (and any gathered units) and their gradients (full ones if gathered; see
        :mod:`distlab.parallel.precision.memory`)."""
        return {
            "parameters": [u.shard for u in self.units] + [u.full for u in self.units],
            "gradients": [u.shard.grad for u in self.units] + [u.full_grad for u in self.units],
        }

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._drop_full_gradients()
        for unit in self.units:
            unit.shard.grad = None

    # ------------------------------------------------------ full gradients ----
    @torch.no_grad()
    def gather_gradients(self) -> None:
        """Put each wrapped parameter's full gradient in its ``.grad``, on every rank.

        Collective, after backward: one all-gather of each unit's gradient shards
        (the gradient of the rank-averaged loss: what single-process training on the
        global batch computes, in the shards' dtype and, for fp16, still times the
        loss scale). Every ``.grad`` is a view into the gathered flat gradient, and
        this rank's shard gradient is its own slice of it, so writing ``.grad``
        (``torch.nn.utils.clip_grad_norm_(fsdp.module.parameters(), ...)``, the same
        on every rank) changes what the optimizer steps. They hold Ψ elements per
        rank until the next forward or :meth:`zero_grad`.
        """
        if self.shard_dtype != self.param_dtype:
            raise ValueError(
                f"gather_gradients puts the full gradient in each weight's .grad, but the "
                f"gradients are {self.shard_dtype} shards and the gathered weights "
                f"{self.param_dtype} (a MixedPrecisionPolicy): use full_gradients(), or "
                "named_gradients() for this rank's parts"
            )
        for unit in self.units:
            if unit.shard.grad is None or unit.full_grad is not None:
                continue
            grad = unit.shard.grad
            full = torch.empty(unit.group.padded_numel, dtype=grad.dtype, device=grad.device)
            self.comm.all_gather(full, grad)
            unit.full_grad = full
            unit.shard.grad = unit.group.shard_of(full)
            for p, view in zip(unit.params, unit.group.views(full)):
                p.grad = view

    @torch.no_grad()
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Parameter name -> its full gradient, in the shards' dtype (collective).

        One all-gather per unit of the gradient shards, like ``DTensor.full_tensor()``
        on FSDP2's sharded gradients; new tensors, so writing them changes nothing (use
        :meth:`gather_gradients` or :meth:`named_gradients` for that)."""
        names = named_parameter_index(self.module)
        out = {}
        for unit in self.units:
            grad = unit.shard.grad
            if grad is None:
                continue
            full = torch.empty(unit.group.padded_numel, dtype=grad.dtype, device=grad.device)
            self.comm.all_gather(full, grad)
            for p, view in zip(unit.params, unit.group.views(full)):
                out[names[id(p)]] = view.clone()
        return out

    def _drop_full_gradients(self) -> None:
        """Undo :meth:`gather_gradients`: keep this rank's part (a copy), free the rest."""
        for unit in self.units:
            if unit.full_grad is None:
                continue
            if unit.shard.grad is not None:  # an optimizer's zero_grad may have dropped it
                unit.shard.grad = unit.shard.grad.clone()
            for p in unit.params:
                p.grad = None
            unit.full_grad = None

    # ---------------------------------------------------- sharded gradients ----
    def any_rank(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank (one all-reduce; collective)."""
        total = torch.tensor([1.0 if flag else 0.0], device=self.units[0].shard.device)
        self.comm.all_reduce_sum_(total)
        return bool(total.item() > 0)

    def _parameter_slices(self) -> dict[str, tuple[_Unit, int, int, int]]:
        """name -> (unit, [lo, hi) in the unit's shard, first element of the parameter there)."""
        names = named_parameter_index(self.module)
        slices = {}
        for unit in self.units:
            start, stop = unit.group.shard_range
            for p, (a, b) in zip(unit.params, unit.group.offsets):
                lo, hi = max(a, start), min(b, stop)
                if lo < hi:
                    slices[names[id(p)]] = (unit, lo - start, hi - start, lo - a)
                else:  # owns none of it: an empty range before or after the owned part
                    slices[names[id(p)]] = (unit, 0, 0, 0 if a >= stop else b - a)
        return slices

    def shard_range(self, name: str) -> tuple[int, int]:
        """``[start, stop)``: the elements of parameter ``name`` (flattened) this rank owns."""
        if name not in self._slices:
            raise ValueError(f"no trainable parameter {name!r}; the names are {list(self._slices)}")
        _, lo, hi, first = self._slices[name]
        return first, first + hi - lo

    def named_gradients(self) -> dict[str, torch.Tensor]:
        """Parameter name -> this rank's part of its gradient after backward (a 1-D view:
        writing it changes what the optimizer sees). Names are the wrapped module's."""
        out = {}
        for name, (unit, lo, hi, _) in self._slices.items():
            if unit.shard.grad is not None:
                out[name] = unit.shard.grad[lo:hi]
        return out

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the sharded gradients so their global norm is at most ``max_norm``.

        The same rule as ``torch.nn.utils.clip_grad_norm_``: total norm
        ``N = (sum over all gradient elements |g|^p)^(1/p)`` (the maximum for
        ``p = inf``), every gradient times ``min(1, max_norm / (N + 1e-6))``.
        Each rank computes its shard's part; an all-gather gives every rank
        all K parts, summed in rank order, so all ranks scale by the same
        factor. Returns ``N`` (collective: call it on every rank).
        ``torch.nn.utils.clip_grad_norm_(fsdp.parameters(), ...)`` would see only
        this rank's shards, a different norm on each rank.
        """
        if not _is_number(max_norm) or not 0 < max_norm < float("inf"):
            raise ValueError(f"max_norm must be a positive finite number, got {max_norm!r}")
        if not _is_number(norm_type) or not norm_type > 0:
            raise ValueError(f"norm_type must be a positive number or inf, got {norm_type!r}")
        grads = [u.shard.grad for u in self.units if u.shard.grad is not None]
        p = float(norm_type)
        device = self.units[0].shard.device
        if not grads:
            local = torch.zeros((), device=device)
        elif p == float("inf"):
            local = torch.stack([g.abs().max().float() for g in grads]).max()
        else:
            local = torch.stack([torch.linalg.vector_norm(g.float(), p) ** p for g in grads]).sum()
        parts = torch.empty(self.comm.world_size, device=device)
        self.comm.all_gather(parts, local.reshape(1))
        total = parts.max() if p == float("inf") else parts.sum() ** (1.0 / p)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for unit in self.units:  # a gathered gradient scales whole, its shard slice included
            g = unit.shard.grad if unit.full_grad is None else unit.full_grad
            if g is not None:
                g.mul_(coefficient.to(g.dtype))
        return total
