"""The collectives a data-parallel method uses, and the thread that runs them.

Every method in :mod:`distlab.parallel` talks to the other ranks through a
:class:`Collectives` object, so the algorithm is chosen once per run:

* ``"ring"``, ``"tree"``, ``"halving_doubling"``, ... (the keys of
  :data:`distlab.sim.algorithms.ALL_REDUCE`): distlab's own all-reduce, written
  from send/recv. Reduce-scatter and all-gather then use distlab's ring
  versions (the only ones it has), broadcast its binomial tree.
* ``"builtin"``: ``torch.distributed``'s own collectives (gloo or NCCL).

It also counts the calls and elements per collective (``calls``,
``elements``), so a test can check that a wrapper really communicates; the
*wire* bytes of distlab's algorithms are counted by
:func:`distlab.collectives.count_traffic`, and every call is reported to an
open :func:`distlab.parallel.comm.trace.trace_comm` (by group name).

Averaging is always "sum, then divide by the world size": the same rounding
on every path, whatever the algorithm.

:class:`CommThread` runs collectives on one background thread, first in,
first out. A collective made of blocking send/recv cannot overlap with
backward if it runs on the thread doing backward; on its own thread it can
(the autograd engine and gloo both release Python's GIL while they work).
Because one thread issues every collective of a rank in submission order,
and every rank submits in the same order, the ranks never disagree about
which collective comes next, which is what keeps them from deadlocking.
"""

from __future__ import annotations

import contextvars
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.collectives import ring_all_gather, ring_reduce_scatter, tree_broadcast
from distlab.collectives.buffers import global_rank
from distlab.parallel.comm.trace import traced
from distlab.sim.algorithms import ALL_REDUCE

#: "builtin" plus the one-level all-reduces of the algorithm registry
#: (:data:`distlab.sim.algorithms.REGISTRY`, through :data:`distlab.sim.algorithms.ALL_REDUCE`)
ALGORITHMS = ("builtin", *ALL_REDUCE)


def world() -> tuple[int, int]:
    """(rank, world size) of the default group; (0, 1) when no group is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass
class Collectives:
    """The four collectives data parallelism needs, run with one chosen algorithm."""

    algorithm: str = "ring"
    group: object = None
    calls: Counter = field(default_factory=Counter)
    elements: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if not dist.is_initialized():
            raise RuntimeError(
                "no process group: build data-parallel wrappers inside distlab.run(...) "
                "or after distlab.init()"
            )
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)

    def _count(self, name: str, tensor: torch.Tensor) -> None:
        self.calls[name] += 1
        self.elements[name] += tensor.numel()

    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        """In place: the sum of ``tensor`` over the ranks."""
        self._count("all_reduce", tensor)
        if self.world_size == 1:
            return
        with traced("all_reduce", self.group, tensor):
            if self.algorithm == "builtin":
                dist.all_reduce(tensor, group=self.group)
            else:
                ALL_REDUCE[self.algorithm](tensor, "sum", self.group)

    def all_reduce_mean_(self, tensor: torch.Tensor) -> None:
        """In place: the average of ``tensor`` over the ranks."""
        self.all_reduce_sum_(tensor)
        if self.world_size > 1:
            tensor.div_(self.world_size)

    def reduce_scatter_sum(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """``output`` (n elements) = the sum over ranks of block ``rank`` of ``input`` (K*n)."""
        self._count("reduce_scatter", input)
        if self.world_size == 1:
            output.view(-1).copy_(input.view(-1))
            return
        with traced("reduce_scatter", self.group, input):
            if self.algorithm == "builtin":
                dist.reduce_scatter_single(output, input, group=self.group)
            else:
                ring_reduce_scatter(output, input, "sum", self.group)

    def reduce_scatter_mean(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """``output`` (n elements) = the average over ranks of block ``rank`` of ``input`` (K*n)."""
        self.reduce_scatter_sum(output, input)
        if self.world_size > 1:
            output.div_(self.world_size)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """``output`` (K*n elements) = every rank's ``input`` (n elements), in rank order."""
        self._count("all_gather", output)
        if self.world_size == 1:
            output.view(-1).copy_(input.view(-1))
            return
        with traced("all_gather", self.group, output):
            if self.algorithm == "builtin":
                dist.all_gather_single(output, input, group=self.group)
            else:
                ring_all_gather(output, input, self.group)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        """In place: every rank gets group rank ``src``'s ``tensor``."""
        self._count("broadcast", tensor)
        if self.world_size == 1:
            return
        with traced("broadcast", self.group, tensor):
            if self.algorithm == "builtin":
                dist.broadcast(tensor, global_rank(self.group, src), group=self.group)
            else:
                tree_broadcast(tensor, src, self.group)


def broadcast_module_state(module: torch.nn.Module, comm: Collectives, src: int = 0) -> None:
    """Make every rank start from rank ``src``'s parameters and buffers (as DDP does)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.numel():
                comm.broadcast_(tensor.data, src)


def broadcast_module_buffers(module: torch.nn.Module, comm: Collectives, src: int = 0) -> None:
    """Overwrite every rank's buffers with rank ``src``'s (DDP does it before each forward)."""
    with torch.no_grad():
        for buffer in module.buffers():
            if buffer.numel():
                comm.broadcast_(buffer.data, src)


class CommThread:
    """One background thread that runs collectives in the order they are submitted.

    ``submit(fn)`` returns a :class:`concurrent.futures.Future`; ``result()``
    on it re-raises, on the caller's thread, any exception ``fn`` raised, so
    a failure in communication surfaces as the rank's error. The context
    (e.g. an active :func:`~distlab.collectives.count_traffic`) is carried
    into the thread.
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[[], object]) -> Future:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distlab-comm")
        return self._executor.submit(contextvars.copy_context().run, fn)

    def run(self, fn: Callable[[], object]) -> object:
        """Submit and wait: synchronous, but still in the one global order."""
        return self.submit(fn).result()

    def close(self) -> None:
        """Stop the thread (a new one starts at the next ``submit``)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False)


def now() -> float:
    """The clock every trace uses (seconds, monotonic)."""
    return time.perf_counter()
