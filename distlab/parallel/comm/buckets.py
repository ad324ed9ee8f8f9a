"""Gradient buckets, and knowing during backward when a bucket's gradients are ready.

**Buckets** (Li et al. 2020, "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training", VLDB, Section 3.2.2 on bucketing and
3.2.3 on overlapping it with backward). All-reducing
each parameter's gradient on its own pays a collective's latency once per
tensor; all-reducing everything after backward cannot overlap with it.
DDP's answer is to cut the parameters into buckets of about ``bucket_cap_mb``
(default 25; PyTorch's "MB" is MiB, 2^20 bytes) in *reverse* order of
``model.parameters()``, because
backward produces gradients roughly from the last layer to the first, and to
all-reduce a bucket as soon as all its gradients exist.

**Readiness** comes from ``Tensor.register_post_accumulate_grad_hook``: the
hook runs right after autograd has added a parameter's gradient into
``param.grad``. :class:`ReadyInOrder` counts those per bucket and calls
``launch(i)`` for bucket 0, 1, 2, ... strictly in index order, each as soon
as it and all buckets before it are complete. The fixed order matters: every
rank must issue its collectives in the same order, or two ranks wait on
different collectives and hang (Li et al. Section 3.2.3 make the same rule).

At the end of backward (a callback queued on the autograd engine, as DDP's
reducer does) buckets that never completed, because some parameter got no
gradient in this step, are launched too, in order, and ``finish()`` runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from distlab.calc.buckets import (
    BYTES_PER_MB,
    DEFAULT_BUCKET_CAP_MB,  # noqa: F401 (re-exported)
    bucket_indices,
)


def bucket_cap_bytes(bucket_cap_mb: float) -> float:
    """``bucket_cap_mb`` in bytes, counted as DDP counts it (1 MB = 2^20 bytes)."""
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)):
        raise TypeError(f"bucket_cap_mb must be a number, got {bucket_cap_mb!r}")
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
    return bucket_cap_mb * BYTES_PER_MB


def assign_buckets(params: Sequence[torch.nn.Parameter], cap_bytes: float) -> list[list]:
    """Cut ``params`` (already in the order gradients are expected) into buckets of
    about ``cap_bytes``: PyTorch's rule, :func:`distlab.calc.buckets.bucket_indices`.
    (With the *default* cap, PyTorch makes the first bucket only 1 MiB, so the
    first all-reduce starts sooner; distlab uses one cap for every bucket.)
    """
    sizes = [p.numel() * p.element_size() for p in params]
    return [[params[i] for i in bucket] for bucket in bucket_indices(sizes, cap_bytes)]


def trainable_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters that get gradients, each once (a tied weight is listed once)."""
    seen: set[int] = set()
    out = []
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def at_end_of_backward(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the current backward pass finishes (must be called during backward)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


class ReadyInOrder:
    """Calls ``launch(i)`` for each group of parameters, in index order, as soon as
    its gradients are ready; then ``finish()`` at the end of backward.

    ``on_ready(i)`` (optional) is told the moment group ``i`` is complete,
    before it may have to wait for earlier groups; traces use it.
    Set ``enabled = False`` to let gradients accumulate with no communication
    (``no_sync``).
    """

    def __init__(
        self,
        groups: Sequence[Sequence[torch.nn.Parameter]],
        launch: Callable[[int], None],
        finish: Callable[[], None],
        on_ready: Callable[[int], None] | None = None,
    ):
        self.groups = [list(g) for g in groups]
        self.launch, self.finish, self.on_ready = launch, finish, on_ready
        self.enabled = True
        self._group_of: dict[int, int] = {}
        for i, group in enumerate(self.groups):
            for p in group:
                if id(p) in self._group_of:
                    raise ValueError("a parameter appears in two groups")
                self._group_of[id(p)] = i
        self._handles = [
            p.register_post_accumulate_grad_hook(self._on_grad) for g in self.groups for p in g
        ]
        self._in_backward = False

    def _start_backward(self) -> None:
        self._in_backward = True
        self._missing = [len(g) for g in self.groups]
        self._next = 0
        at_end_of_backward(self._end_backward)

    def _on_grad(self, param: torch.nn.Parameter) -> None:
        if not self.enabled:
            return
        if not self._in_backward:
            self._start_backward()
        i = self._group_of[id(param)]
        self._missing[i] -= 1
        if self._missing[i] == 0 and self.on_ready is not None:
            self.on_ready(i)
        while self._next < len(self.groups) and self._missing[self._next] == 0:
            self._next += 1
            self.launch(self._next - 1)

    def _end_backward(self) -> None:
        self._in_backward = False
        while self._next < len(self.groups):  # groups with a parameter that got no gradient
            self._next += 1
            if self.on_ready is not None and self._missing[self._next - 1]:
                self.on_ready(self._next - 1)
            self.launch(self._next - 1)
        self.finish()

    def remove(self) -> None:
        """Unregister the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
