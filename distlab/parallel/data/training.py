"""One training step for every data-parallel method, behind one small interface.

``build(method, model, ...)`` returns a :class:`Trainer` whose ``model`` is
what to call forward on and whose ``optimizer`` has ``step()`` and
``zero_grad()``, so a loop, a test or a benchmark can run any method:

=====================  =======================================================
``"single"``           the plain model and optimizer (no communication)
``"naive_ddp"``        :class:`~distlab.parallel.data.ddp.NaiveDDP`
``"bucketed_ddp"``     :class:`~distlab.parallel.data.ddp.BucketedDDP` (overlap)
``"zero1"``            plain model + :class:`~distlab.parallel.zero.optimizer.ZeroOptimizer` stage 1
``"zero2"``            the same, stage 2
``"fsdp"``             :class:`~distlab.parallel.zero.fsdp.FSDP` + optimizer on its shards
=====================  =======================================================

A bf16/fp16 model trains through fp32 master weights (the ``mixed_adam``
recipe): :class:`~distlab.parallel.precision.mixed_precision.MixedPrecisionOptimizer`
for single, DDP and FSDP (masters of the shards), ZeRO's own master shards
for ZeRO. For FSDP the better way is an fp32 model with
``mixed_precision=MixedPrecisionPolicy(param_dtype=...)``, as FSDP2: the fp32
shards are the masters and the plain optimizer steps them (``fp32_adam`` at
stage 3); a ``loss_scaler`` (fp16) adds a ``MixedPrecisionOptimizer`` that
steps them in place.

:func:`train_step` does forward, backward (over ``micro_batches`` with the
loss divided by their number) and the optimizer step on this rank's part of
a global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from distlab.core.checks import positive
from distlab.parallel.comm.buckets import DEFAULT_BUCKET_CAP_MB
from distlab.parallel.comm.collectives import world
from distlab.parallel.data.accumulation import accumulate_gradients
from distlab.parallel.data.ddp import BucketedDDP, NaiveDDP
from distlab.parallel.data.sampler import shard_batch
from distlab.parallel.precision.mixed_precision import (
    LOW_PRECISION,
    MixedPrecisionOptimizer,
    MixedPrecisionPolicy,
)
from distlab.parallel.zero.fsdp import FSDP
from distlab.parallel.zero.optimizer import ZeroOptimizer

METHODS = ("single", "naive_ddp", "bucketed_ddp", "zero1", "zero2", "fsdp")


@dataclass
class Trainer:
    """What a training loop needs: a model to call, an optimizer, and which method it is."""

    method: str
    model: nn.Module
    optimizer: object


def build(
    method: str,
    model: nn.Module,
    *,
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
    algorithm: str = "ring",
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    wrap="layer",
    prefetch: bool = False,
    mixed_precision: MixedPrecisionPolicy | None = None,
    **optimizer_kwargs,
) -> Trainer:
    """Wrap ``model`` for ``method`` (one of :data:`METHODS`) and build its optimizer.

    ``mixed_precision`` is FSDP's policy; other methods take a model already cast.
    ``optimizer_kwargs`` go to ``optimizer_class``; an ``lr`` must be a finite number > 0.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if next(model.parameters(), None) is None:
        raise ValueError(f"model {type(model).__name__} has no parameters to train")
    if "lr" in optimizer_kwargs:  # torch's SGD trains with lr=nan (it only refuses lr < 0)
        positive("lr", optimizer_kwargs["lr"])
    if mixed_precision is not None and method != "fsdp":
        raise ValueError(
            f"mixed_precision is FSDP's policy; for {method!r} cast the model first "
            "(model.to(torch.bfloat16))"
        )

    def make_optimizer(module: nn.Module):
        low_precision = next(module.parameters()).dtype in LOW_PRECISION
        if low_precision or "loss_scaler" in optimizer_kwargs:  # fp32 masters, a loss scale
            return MixedPrecisionOptimizer(module, optimizer_class, **optimizer_kwargs)
        return optimizer_class(module.parameters(), **optimizer_kwargs)

    if method == "single":
        return Trainer(method, model, make_optimizer(model))
    if method == "naive_ddp":
        ddp = NaiveDDP(model, algorithm=algorithm)
        return Trainer(method, ddp, make_optimizer(model))
    if method == "bucketed_ddp":
        ddp = BucketedDDP(model, algorithm=algorithm, bucket_cap_mb=bucket_cap_mb)
        return Trainer(method, ddp, make_optimizer(model))
    if method in ("zero1", "zero2"):
        zero = ZeroOptimizer(
            model,
            optimizer_class,
            stage=int(method[-1]),
            algorithm=algorithm,
            bucket_cap_mb=bucket_cap_mb,
            **optimizer_kwargs,
        )
        return Trainer(method, model, zero)
    if method == "fsdp":
        fsdp = FSDP(
            model,
            wrap=wrap,
            algorithm=algorithm,
            prefetch=prefetch,
            mixed_precision=mixed_precision,
        )
        return Trainer(method, fsdp, make_optimizer(fsdp))
    raise AssertionError(f"method {method!r} is in METHODS but has no branch")


def mse_loss(model: nn.Module, batch) -> torch.Tensor:
    """Mean squared error of ``model(x)`` against ``y`` for a batch ``(x, y)``.

    ``x`` is cast to the model's dtype; the loss is computed in fp32.
    """
    x, y = batch
    dtype = next(model.parameters()).dtype
    return F.mse_loss(model(x.to(dtype)).float(), y.float())


def lm_loss(model: nn.Module, batch) -> torch.Tensor:
    """Mean next-token cross-entropy for a batch ``(tokens, targets)``."""
    tokens, targets = batch
    logits = model(tokens).float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def train_step(
    trainer: Trainer,
    global_batch,
    loss_fn: Callable[[nn.Module, object], torch.Tensor],
    *,
    micro_batches: int = 1,
) -> float:
    """One step on this rank's shard of ``global_batch``; returns the mean local loss.

    ``"single"`` trains on the whole batch; every other method takes its
    :func:`~distlab.parallel.data.sampler.shard_batch` part. ``micro_batches > 1``
    accumulates gradients (loss divided by their number). An optimizer with a
    loss scale (a :class:`~distlab.parallel.precision.mixed_precision.MixedPrecisionOptimizer`
    with a ``loss_scaler``) gets its loss multiplied by that scale.
    """
    rank, world_size = world()
    local = (
        global_batch if trainer.method == "single" else shard_batch(global_batch, rank, world_size)
    )
    if micro_batches < 1 or local[0].shape[0] % micro_batches:
        raise ValueError(
            f"micro_batches must divide the local batch of {local[0].shape[0]}, got {micro_batches!r}"
        )
    pieces = list(zip(*(t.chunk(micro_batches) for t in local)))
    trainer.optimizer.zero_grad()
    multiplier = getattr(trainer.optimizer, "scale", 1.0)
    loss = accumulate_gradients(trainer.model, loss_fn, pieces, loss_multiplier=multiplier)
    trainer.optimizer.step()
    return loss
