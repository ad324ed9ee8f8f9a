"""Gradient accumulation: K micro-batches, one optimizer step.

A batch too large for memory is cut into K micro-batches; backward on each
adds into ``param.grad`` (autograd accumulates, it never overwrites), and one
``optimizer.step()`` follows. With a mean loss, the full-batch gradient is

    grad( (1/B) sum_i loss_i ) = sum over micro-batches k of grad( (1/K) * mean_k loss )

for K equal micro-batches of B/K samples: each micro-batch's loss must be
divided by K. Forgetting it makes the gradients K times too large, which
:func:`gradient_scale_error` exposes.

Under data parallelism only the last micro-batch needs to communicate: the
first K-1 backward passes run inside ``model.no_sync()``, so the gradients
are summed locally and averaged over ranks once (Li et al. 2020, Section
3.2.4, "gradient accumulation").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch


def accumulate_gradients(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, object], torch.Tensor],
    micro_batches: Sequence,
    *,
    scale_loss: bool = True,
    loss_multiplier: float = 1.0,
) -> float:
    """Backward over ``micro_batches``, communicating only on the last one.

    ``loss_fn(model, micro_batch)`` returns the mean loss of one micro-batch.
    ``model`` may be a DDP wrapper (its ``no_sync()`` is used) or a plain
    module. Returns the mean loss over the micro-batches; ``.grad`` then holds
    the full-batch gradient (``scale_loss=False`` is the classic bug) times
    ``loss_multiplier`` (an fp16 loss scale, which the optimizer divides out).
    """
    k = len(micro_batches)
    if k == 0:
        raise ValueError("micro_batches is empty; need at least one micro-batch")
    total = 0.0
    for i, batch in enumerate(micro_batches):
        last = i == k - 1
        no_sync = getattr(model, "no_sync", None)
        context = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with context:
            loss = loss_fn(model, batch)
            scaled = loss / k if scale_loss else loss
            (scaled * loss_multiplier if loss_multiplier != 1.0 else scaled).backward()
        total += float(loss.detach())
    return total / k


def gradient_scale_error(grads: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> float:
    """The factor by which ``grads`` are larger than ``reference`` (least squares fit).

    1.0 means the accumulation was scaled right; K means the loss was not
    divided by the number of micro-batches.
    """
    g = torch.cat([t.reshape(-1).double() for t in grads])
    r = torch.cat([t.reshape(-1).double() for t in reference])
    denominator = float(r @ r)
    if denominator == 0:
        raise ValueError("reference gradients are all zero; the scale is undefined")
    return float(g @ r) / denominator
