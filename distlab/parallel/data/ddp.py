"""Distributed data parallel (DDP): every rank holds the whole model, gradients are averaged.

Each of K ranks runs forward and backward on its own slice of the global
batch (see :mod:`distlab.parallel.data.sampler`); averaging the K gradients gives the
gradient of the mean loss over the whole batch, so after ``optimizer.step()``
every rank holds the same parameters as one process training on the full
batch. The all-reduce moves 2Ψ(K-1)/K elements per rank with a ring.

Two versions, to compare:

* :class:`NaiveDDP` waits for backward to finish, then all-reduces each
  parameter's gradient on its own: one collective per tensor (latency paid
  many times) and nothing overlaps with compute.
* :class:`BucketedDDP` follows Li et al. 2020 ("PyTorch Distributed:
  Experiences on Accelerating Data Parallel Training", VLDB, Section 3.2):
  gradients live in flat buckets of ``bucket_cap_mb`` (25 MiB by default)
  filled in reverse parameter order; as soon as a bucket's gradients are all
  ready, its all-reduce starts on a communication thread while backward keeps
  computing the earlier layers' gradients.

Both broadcast rank 0's parameters and buffers at construction (so all
replicas start equal), average with "sum, then divide by K", and offer
``no_sync()`` for gradient accumulation: inside it, backward only accumulates
locally and the next backward outside it communicates the sum.

Buffers (BatchNorm's running statistics, masks) have no gradient, so nothing
keeps them equal: each rank would update them from its own samples. Like
PyTorch's DDP (``broadcast_buffers=True``, called ``forward_sync_buffers`` since
PyTorch 2.13), both wrappers broadcast rank 0's
buffers at the start of every training forward (not under ``torch.no_grad()``,
so rank 0 may evaluate alone, and not inside ``no_sync()``, again like
PyTorch); ``broadcast_buffers=False`` lets the ranks drift (or use :class:`~distlab.parallel.data.sync_batchnorm.SyncBatchNorm`,
whose statistics come from every rank's batch).

Communication thread: distlab's collectives are blocking calls built from
isend/irecv, so :class:`BucketedDDP` hands each ready bucket to a
:class:`~distlab.parallel.comm.collectives.CommThread` (one per rank, first in first out)
and waits for all of them in a callback queued at the end of backward. The
built-in alternative is ``dist.all_reduce(..., async_op=True)``, which runs
on the backend's own threads; one thread here works for every algorithm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Future

import torch
from torch import nn

from distlab.collectives.buffers import Group
from distlab.parallel.comm.buckets import (
    DEFAULT_BUCKET_CAP_MB,
    ReadyInOrder,
    assign_buckets,
    bucket_cap_bytes,
    trainable_parameters,
)
from distlab.parallel.comm.collectives import (
    Collectives,
    CommThread,
    broadcast_module_buffers,
    broadcast_module_state,
)
from distlab.parallel.data.step_trace import TraceRecorder


class _Replicated(nn.Module):
    """What both DDP versions share: a full replica of ``module`` that starts
    from rank 0's state, rank 0's buffers before each training forward, and
    ``no_sync()``. A subclass sets ``self._tracker`` (its :class:`ReadyInOrder`)."""

    _tracker: ReadyInOrder

    def __init__(self, module: nn.Module, algorithm: str, group: Group, broadcast_buffers: bool):
        super().__init__()
        self.module = module
        self.comm = Collectives(algorithm, group)
        self.broadcast_buffers = broadcast_buffers
        broadcast_module_state(module, self.comm)

    def _sync_buffers(self) -> None:
        """PyTorch's rule: broadcast in a forward that a syncing backward will follow."""
        if self.broadcast_buffers and torch.is_grad_enabled() and self._tracker.enabled:
            broadcast_module_buffers(self.module, self.comm)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside accumulates gradients locally, without communicating."""
        self._tracker.enabled = False
        try:
            yield
        finally:
            self._tracker.enabled = True

    def model_state_tensors(self) -> dict[str, list]:
        """Parameters and gradients this rank holds (see :mod:`distlab.parallel.precision.memory`)."""
        params = list(self.module.parameters())
        return {"parameters": params, "gradients": [p.grad for p in params]}


class NaiveDDP(_Replicated):
    """All-reduce every gradient, one parameter at a time, after backward.

    ``loss.backward()`` returns with averaged gradients (the all-reduces run
    in a callback at the end of backward).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        algorithm: str = "ring",
        group: Group = None,
        broadcast_buffers: bool = True,
    ):
        super().__init__(module, algorithm, group, broadcast_buffers)
        self.params = trainable_parameters(module)
        self._tracker = ReadyInOrder([self.params], lambda i: None, self.sync_gradients)

    def forward(self, *args, **kwargs):
        self._sync_buffers()
        return self.module(*args, **kwargs)

    def sync_gradients(self) -> None:
        """Average each parameter's gradient over the ranks (zeros where it has none)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.comm.all_reduce_mean_(p.grad)


class _Bucket:
    """A flat gradient buffer; each parameter's ``.grad`` is a view into it."""

    def __init__(self, params: list[nn.Parameter]):
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"a bucket needs one dtype, got {sorted(map(str, dtypes))}")
        self.params = params
        self.flat = torch.zeros(
            sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
        )
        self.views = []
        start = 0
        for p in params:
            self.views.append(self.flat[start : start + p.numel()].view_as(p))
            start += p.numel()
        for p, view in zip(params, self.views):
            p.grad = view

    @property
    def n_bytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def adopt_gradients(self) -> None:
        """Make sure every ``.grad`` is the bucket's view again.

        After ``optimizer.zero_grad()`` (which sets ``.grad = None``) autograd
        allocates fresh gradient tensors: copy them in. A parameter that got
        no gradient this step contributes zeros.
        """
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            else:
                continue
            p.grad = view


class BucketedDDP(_Replicated):
    """DDP with gradient buckets whose all-reduce overlaps with backward.

    ``overlap=False`` still buckets but starts every all-reduce only after
    backward (to measure what overlap buys). ``trace.steps`` holds a
    :class:`~distlab.parallel.data.step_trace.StepTrace` per step.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
        algorithm: str = "ring",
        group: Group = None,
        overlap: bool = True,
        broadcast_buffers: bool = True,
    ):
        super().__init__(module, algorithm, group, broadcast_buffers)
        self.overlap = overlap
        params = trainable_parameters(module)
        groups = assign_buckets(params[::-1], bucket_cap_bytes(bucket_cap_mb))
        self.buckets = [_Bucket(g) for g in groups]
        self.trace = TraceRecorder([b.n_bytes for b in self.buckets])
        self._tracker = ReadyInOrder(
            [b.params for b in self.buckets],
            self._launch,
            self._finish,
            on_ready=lambda i: self.trace.bucket(i, "ready"),
        )
        self._thread = CommThread()
        self._launched: list[int] = []
        self._futures: list[Future] = []

    def forward(self, *args, **kwargs):
        self._sync_buffers()
        self.trace.forward_start()
        out = self.module(*args, **kwargs)
        self.trace.forward_end()
        return out

    def _all_reduce(self, index: int) -> None:
        self.trace.bucket(index, "start")
        self.comm.all_reduce_mean_(self.buckets[index].flat)
        self.trace.bucket(index, "end")

    def _launch(self, index: int) -> None:
        self.buckets[index].adopt_gradients()
        self._launched.append(index)
        if self.overlap:
            self._futures.append(self._thread.submit(lambda: self._all_reduce(index)))

    def _finish(self) -> None:
        self.trace.backward_end()
        if not self.overlap:
            self._futures = [
                self._thread.submit(lambda i=i: self._all_reduce(i)) for i in self._launched
            ]
        futures, self._futures, self._launched = self._futures, [], []
        for future in futures:
            future.result()  # re-raises a failure of the communication thread here
        self._thread.close()
        self.trace.sync_end()

    def zero_grad(self) -> None:
        """Zero the gradient buckets in place (cheaper than ``optimizer.zero_grad()``)."""
        for bucket in self.buckets:
            bucket.flat.zero_()
            for p, view in zip(bucket.params, bucket.views):
                p.grad = view
