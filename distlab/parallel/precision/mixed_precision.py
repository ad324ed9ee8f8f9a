"""Mixed precision: compute in 16 bits, keep fp32 master weights, scale fp16 losses.

Micikevicius et al. 2018 ("Mixed Precision Training", ICLR), Section 3:

* **fp32 master weights** (3.1). The model's weights and gradients are
  16-bit, but the optimizer updates an fp32 copy: an update lr*g is often
  smaller than half a unit in the last place of a 16-bit weight (bf16 keeps 8
  significant bits, fp16 11) and would round away. After each step the
  master is rounded back into the model. Memory: 2 + 2 bytes per parameter
  for the model and its gradients, 4 + 4 + 4 for master, m and v (the ZeRO
  paper's K = 12).
* **loss scaling** (3.2), for fp16 only. fp16's smallest subnormal is
  2^-24 ≈ 6e-8 and its largest value 65504; small gradients underflow to
  zero. Multiplying the loss by S shifts every gradient up by S; the
  optimizer divides it out in fp32. bf16 has fp32's exponent range and needs
  no scaling.
* **dynamic** loss scaling (the variant in NVIDIA's and PyTorch's
  ``GradScaler``): start high, and if any gradient is inf or NaN, skip the
  step and halve S; after ``growth_interval`` good steps in a row, double S.

The other way to compute in 16 bits is ``torch.autocast`` (see
:func:`autocast`): the model stays fp32 (its weights *are* the masters) and
selected ops run in bf16/fp16 on the fly.

Use with data parallelism: cast the model first, wrap it (DDP broadcasts
rank 0's weights), then build :class:`MixedPrecisionOptimizer` from the
wrapped model, so the masters start from the broadcast weights. Gradients are
then all-reduced in 16 bits (half of fp32's bytes), and an inf on any rank
reaches every rank through the sum, so all ranks skip the same steps.

With :class:`~distlab.parallel.zero.fsdp.FSDP`, a :class:`MixedPrecisionPolicy`
says which dtype the gathered weights (and so the compute) use and which
dtype the gradients are reduce-scattered in, as PyTorch's FSDP2: the shards
themselves stay fp32 and are the master weights, so a plain torch optimizer
steps them. For fp16, :class:`MixedPrecisionOptimizer` built on the FSDP model
adds the loss scale and steps those fp32 shards in place (no copy). A rank
then sees only its own shard of the gradients, and an overflow may land in
another rank's shard, so the model's ``any_rank(found_inf)`` (one all-reduce
of a flag) makes every rank skip the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from distlab.core.checks import positive_int
from distlab.parallel.precision.memory import optimizer_state_tensors

LOW_PRECISION = (torch.bfloat16, torch.float16)
FLOATING = (torch.float32, *LOW_PRECISION)


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Which dtypes FSDP computes and communicates in (PyTorch FSDP's ``MixedPrecisionPolicy``).

    * ``param_dtype``: the dtype of the gathered weights, so of the forward and
      backward compute (``None``: the model's dtype). The shards keep the
      model's dtype (fp32: the master weights); each all-gather casts this
      rank's shard to ``param_dtype`` first.
    * ``reduce_dtype``: the dtype gradients are summed in by the
      reduce-scatter (``None``: ``param_dtype``). fp32 rounds once, at the
      end, instead of after every addition; the shard's gradient is then
      cast to the shard's dtype.
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        for field_name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, field_name)
            if value is not None and value not in FLOATING:
                raise ValueError(
                    f"{field_name} must be None or one of {[str(d) for d in FLOATING]}, "
                    f"got {value!r}"
                )


def autocast(device: torch.device | str, dtype: torch.dtype = torch.bfloat16):
    """``torch.autocast`` for ``device`` ("cpu" or "cuda"); CUDA only when it is available."""
    device_type = torch.device(device).type
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("autocast on 'cuda' was asked for, but CUDA is not available")
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"autocast device must be 'cpu' or 'cuda', got {device_type!r}")
    return torch.autocast(device_type=device_type, dtype=dtype)


def grads_are_finite(tensors) -> bool:
    """True when no tensor holds an inf or a NaN."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if t is not None)


class DynamicLossScaler:
    """Loss scale that halves on overflow and doubles after ``growth_interval`` good steps."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        *,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
        if not growth_factor > 1 or not 0 < backoff_factor < 1:
            raise ValueError(
                f"need growth_factor > 1 and 0 < backoff_factor < 1, got {growth_factor!r}, "
                f"{backoff_factor!r}"
            )
        growth_interval = positive_int("growth_interval", growth_interval)
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.good_steps = 0
        self.skipped_steps = 0

    def state_dict(self) -> dict:
        """What a checkpoint keeps so a resumed run scales as the uninterrupted one would:
        the scale, the good steps counted towards the next growth, the steps skipped, and
        the settings."""
        return {"scale": self.scale, "good_steps": self.good_steps,
                "skipped_steps": self.skipped_steps, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Take over a :meth:`state_dict` (``ValueError`` naming a missing key)."""
        missing = sorted(set(self.state_dict()) - set(state))
        if missing:
            raise ValueError(f"a loss scaler's state needs {missing}")
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.growth_factor, self.backoff_factor = state["growth_factor"], state["backoff_factor"]
        self.growth_interval = int(state["growth_interval"])

    def update(self, found_inf: bool) -> None:
        """After a step: back off on overflow, grow after a run of good steps."""
        if found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped_steps += 1
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0


def _is_dynamic_scaler(obj) -> bool:
    """A loss scaler is anything with a ``scale`` and an ``update(found_inf)``."""
    return hasattr(obj, "scale") and callable(getattr(obj, "update", None))


class MixedPrecisionOptimizer:
    """A model that computes in 16 bits, trained through fp32 master weights.

    The masters are fp32 copies of a bf16/fp16 model's weights, updated and
    rounded back after each step; or, for an :class:`~distlab.parallel.zero.fsdp.FSDP`
    model under a 16-bit :class:`MixedPrecisionPolicy`, its fp32 shards
    themselves (FSDP2's design: they already are the masters), stepped in place.

    ``loss_scaler``: ``None`` (no scaling: right for bf16), a
    :class:`DynamicLossScaler` (or any object with a ``scale`` attribute and
    an ``update(found_inf)`` method, e.g. one a student wrote), or a number
    for a fixed scale with no overflow check (to see what goes wrong without
    the dynamic one). Call
    ``opt.scale_loss(loss).backward()``; ``step()`` returns False when it
    skipped the update because a gradient overflowed.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer_class=torch.optim.Adam,
        *,
        loss_scaler: DynamicLossScaler | float | None = None,
        **optimizer_kwargs,
    ):
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        # FSDP under a 16-bit policy: fp32 shards, 16-bit gathered weights and compute
        self.in_place = (
            dtypes == {torch.float32} and getattr(model, "param_dtype", None) in LOW_PRECISION
        )
        if not dtypes or not (self.in_place or dtypes <= set(LOW_PRECISION)):
            raise ValueError(
                f"MixedPrecisionOptimizer expects a bf16/fp16 model (cast it first with "
                f"model.to(torch.bfloat16)) or an FSDP model with a 16-bit MixedPrecisionPolicy; "
                f"its parameters are {sorted(map(str, dtypes))}"
            )
        if not (
            loss_scaler is None
            or isinstance(loss_scaler, (int, float))
            or _is_dynamic_scaler(loss_scaler)
        ):
            raise TypeError(
                "loss_scaler must be None, a number, or a scaler with a `scale` attribute and "
                f"an `update(found_inf)` method like DynamicLossScaler; got {loss_scaler!r}"
            )
        self.loss_scaler = loss_scaler
        # a model whose gradients are sharded (FSDP) says whether any rank overflowed
        self._any_rank = getattr(model, "any_rank", None)
        if self.in_place:
            self.masters = self.params
        else:
            self.masters = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optimizer = optimizer_class(self.masters, **optimizer_kwargs)

    @property
    def scale(self) -> float:
        if _is_dynamic_scaler(self.loss_scaler):
            return float(self.loss_scaler.scale)
        return 1.0 if self.loss_scaler is None else float(self.loss_scaler)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward()`` on."""
        return loss * self.scale if self.scale != 1.0 else loss

    @torch.no_grad()
    def step(self) -> bool:
        """Unscale the gradients into the fp32 masters, update, round back into the model."""
        grads = [p.grad for p in self.params]
        scale = self.scale  # the scale this backward used
        if _is_dynamic_scaler(self.loss_scaler):
            found_inf = not grads_are_finite(grads)
            if self._any_rank is not None:
                found_inf = self._any_rank(found_inf)
            self.loss_scaler.update(found_inf)
            if found_inf:
                return False
        if self.in_place:  # the masters are the parameters: unscale their gradients
            for grad in grads:
                if grad is not None and scale != 1.0:
                    grad.div_(scale)
            self.optimizer.step()
            return True
        for master, grad in zip(self.masters, grads):
            if grad is not None:
                master.grad = grad.float() / scale
        self.optimizer.step()
        for p, master in zip(self.params, self.masters):
            p.copy_(master)
            master.grad = None
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def model_state_tensors(self) -> dict[str, list]:
        """Weights and gradients; masters (unless they are the weights) and optimizer state."""
        states, counters = optimizer_state_tensors(self.optimizer)
        masters = [] if self.in_place else self.masters
        return {
            "parameters": self.params,
            "gradients": [p.grad for p in self.params],
            "optimizer_states": masters + states,
            "optimizer_step_counters": counters,
        }
