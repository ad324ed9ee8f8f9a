"""Trace every collective and point-to-point message of a training step, by process group.

``trace_comm()`` is a context manager like
:func:`distlab.collectives.count_traffic`: open it on every rank around any
training code (``train_3d``, a DDP step, an MoE layer) and it records each
communication call the code makes, without the code knowing::

    with trace_comm() as trace:                      # on every rank
        train_3d(config, tokens, targets, tp=2, pp=2, dp=2, micro_batches=2, steps=1, lr=0.1)
    trace.calls                                      # [CommCall("tp", "all_reduce", ...), ...]

Each kind of communication passes through one place, and that place reports
to the active trace (:func:`traced`):

* :class:`~distlab.parallel.comm.collectives.Collectives` (and its subclass
  ``TensorParallelComm``): all_reduce, reduce_scatter, all_gather and
  broadcast on its ``group``;
* the pipeline executor (:mod:`distlab.parallel.pipeline.executor`): ``send``
  and ``recv`` of activations and gradients (group ``"pp"``), the shape
  header before each (``"send header"``, ``"recv header"``), and the
  tied-embedding gradient exchange between the first and last stage (group
  ``"embedding"``, Megatron-LM's name for those two ranks);
* MoE's :func:`~distlab.parallel.moe.layer.exchange_blocks`: all_to_all (group ``"ep"``).

A process group is named by :func:`~distlab.parallel.compose.mesh.build_mesh`, which
tells the active trace the name of every group it creates (a group that
serves several names, such as ``"dp"``, ``"dp-cp"`` and ``"expert_dp"`` when
cp = ep = 1, keeps the first in :data:`distlab.core.ranks.GROUP_NAMES`);
a group the trace was not told about is named by its ranks (``"ranks 0,2"``).

Per call it records the elements and **payload bytes** (the whole buffer:
the tensor all-reduced or sent, the *output* of an all-gather, the *input* of
a reduce-scatter, as :class:`distlab.calc.volume.CommPart` counts them) and the
**wire bytes** this rank sent: for distlab's collectives, what
:func:`~distlab.collectives.count_traffic` counts inside the call; for a
send, the tensor's bytes; for a receive, 0. A call on a one-rank group moves
nothing and is not recorded. Collectives run with ``algorithm="builtin"``
(``torch.distributed``'s own) are recorded with wire bytes 0: distlab cannot
see inside them.

With no trace open, each hook costs one context-variable lookup.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.collectives.buffers import Group
from distlab.collectives.traffic import count_traffic


@dataclass(frozen=True)
class CommCall:
    """One communication call on one rank."""

    rank: int  # global rank that made the call
    group: str  # "tp", "pp", "dp", ..., or "ranks 0,2"
    collective: (
        str  # "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send", ...
    )
    group_size: int
    elements: int
    payload_bytes: int
    wire_bytes: int  # bytes this rank put on the wire for this call


@dataclass
class CommTrace:
    """Every :class:`CommCall` of this rank inside :func:`trace_comm`."""

    rank: int
    calls: list[CommCall] = field(default_factory=list)
    names: dict[tuple[int, ...], str] = field(default_factory=dict)  # group ranks -> name

    def name_of(self, ranks: tuple[int, ...]) -> str:
        return self.names.get(ranks, "ranks " + ",".join(map(str, ranks)))


_active: contextvars.ContextVar[CommTrace | None] = contextvars.ContextVar(
    "comm_trace", default=None
)
_IDLE = contextlib.nullcontext()


@contextlib.contextmanager
def trace_comm() -> Iterator[CommTrace]:
    """Record every communication call this rank makes inside the block (see the module docstring).

    Traces nest: what an inner trace recorded (a training loop's per-step trace) is
    added to the one around it (a test's trace of the whole run) when the inner closes,
    and the inner one starts with the outer one's group names."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    outer = _active.get()
    trace = CommTrace(rank, names=dict(outer.names) if outer is not None else {})
    token = _active.set(trace)
    try:
        yield trace
    finally:
        _active.reset(token)
        if outer is not None:
            outer.calls.extend(trace.calls)
            for ranks, name in trace.names.items():
                outer.names.setdefault(ranks, name)


def group_ranks(group: Group) -> tuple[int, ...]:
    """The global ranks of ``group`` (``None``: the whole world), in group-rank order."""
    if group is None or group is dist.group.WORLD:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


def name_groups(named: dict[str, object]) -> None:
    """Tell the active trace (if any) the names of process groups: ``{"tp": group, ...}``.
    A rank list keeps the first name it is given."""
    trace = _active.get()
    if trace is not None:
        for name, group in named.items():
            trace.names.setdefault(group_ranks(group), name)


def traced(collective: str, group: Group, tensor: torch.Tensor, *, name: str | None = None):
    """Context manager around one collective call on ``group`` with payload ``tensor``.

    ``name`` overrides the group's registered name (MoE's all-to-all is always
    ``"ep"``). Nothing happens when no trace is open or the group has one rank.
    """
    trace = _active.get()
    if trace is None:
        return _IDLE
    ranks = group_ranks(group)
    if len(ranks) == 1:
        return _IDLE
    return _record_call(trace, name or trace.name_of(ranks), collective, len(ranks), tensor)


@contextlib.contextmanager
def _record_call(trace, group_name, collective, size, tensor) -> Iterator[None]:
    with count_traffic() as wire:
        yield
    trace.calls.append(
        CommCall(trace.rank, group_name, collective, size, tensor.numel(),
                 tensor.numel() * tensor.element_size(), wire.bytes_sent)
    )  # fmt: skip


def record_p2p(direction: str, group: str, peers: int, tensor: torch.Tensor) -> None:
    """Record one point-to-point message (``direction`` ``"send"``, ``"recv"``, or with a
    suffix such as ``"send header"``) of ``tensor`` in group ``group`` of ``peers`` ranks;
    a send's wire bytes are the tensor's bytes, a receive's 0."""
    trace = _active.get()
    if trace is None:
        return
    nbytes = tensor.numel() * tensor.element_size()
    wire = nbytes if direction.startswith("send") else 0
    trace.calls.append(
        CommCall(trace.rank, group, direction, peers, tensor.numel(), nbytes, wire)
    )  # fmt: skip
