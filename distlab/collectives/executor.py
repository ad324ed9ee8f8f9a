"""Run a :class:`~distlab.core.collective_schedule.Schedule` on real processes.

One executor serves every algorithm. Read :func:`run_steps` first: it is the
whole idea. For each step of the schedule, a rank

1. posts a non-blocking send (``isend``) for every chunk it sends and a
   non-blocking receive (``irecv``) for every chunk it receives (a chunk it
   will reduce lands in a scratch tensor);
2. waits for all of them;
3. combines each scratch tensor into its chunk (sum, max, ...).

:func:`execute` plays the same schedule with a faster engine
(:mod:`distlab.collectives.pipelined`: messages cut into segments, the next
step started as soon as its data has landed), tested equal to
:func:`run_steps`. Only point-to-point operations are used; never a built-in
collective.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from distlab.core.collective_schedule import Schedule, chunk_bounds

if TYPE_CHECKING:  # pragma: no cover
    from .pipelined import Workspace

#: The pipelined engine cuts messages into pieces of at most this many bytes.
DEFAULT_SEGMENT_BYTES = 4 << 20

SUPPORTED_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
)

_OP_NAMES = ("sum", "avg", "product", "max", "min")


def op_name(op) -> str:
    """Normalise ``op`` (a ``torch.distributed.ReduceOp`` or a string) to a name.

    Raises ``ValueError`` naming the op and the allowed ones.
    """
    if op is None:
        return "sum"
    if isinstance(op, str):
        name = op.lower()
    else:
        name = next((n for n in _OP_NAMES if op == getattr(dist.ReduceOp, n.upper())), None)
    if name not in _OP_NAMES:
        raise ValueError(f"unsupported reduce op {op!r}; allowed: ReduceOp.SUM/AVG/PRODUCT/MAX/MIN")
    return name


def combine_(dst: torch.Tensor, src: torch.Tensor, op: str) -> None:
    """``dst = op(dst, src)`` in place. AVG sums here; the caller divides once at the end."""
    if op in ("sum", "avg"):
        dst.add_(src)
    elif op == "product":
        dst.mul_(src)
    elif op == "max":
        torch.maximum(dst, src, out=dst)
    elif op == "min":
        torch.minimum(dst, src, out=dst)
    else:  # pragma: no cover - op_name() already rejected it
        raise ValueError(op)


def finish_average_(tensor: torch.Tensor, op: str, world_size: int) -> None:
    """Turn a SUM into an AVG (only for the ranks that hold a result)."""
    if op == "avg" and tensor.numel():
        tensor.div_(world_size)


# ---------------------------------------------------------------- buffers ----
class Chunks:
    """The pieces a schedule's chunk indices refer to.

    Either one flat tensor cut at ``bounds`` (a run of chunks is then one
    contiguous slice, sent as one message), or a list of separate tensors,
    one per chunk (all-to-all).
    """

    def __init__(self, pieces: Sequence[torch.Tensor], flat=None, bounds=None):
        self.pieces = list(pieces)
        self.flat = flat
        self.bounds = bounds

    @classmethod
    def of_flat(cls, flat: torch.Tensor, bounds: Sequence[tuple[int, int]]) -> Chunks:
        flat = flat.view(-1)
        return cls([flat[a:b] for a, b in bounds], flat, list(bounds))

    @classmethod
    def split(cls, flat: torch.Tensor, n_chunks: int) -> Chunks:
        """Cut ``flat`` into ``n_chunks`` near-equal pieces (:func:`chunk_bounds`)."""
        return cls.of_flat(flat, chunk_bounds(flat.numel(), n_chunks))

    @classmethod
    def of_list(cls, tensors: Sequence[torch.Tensor]) -> Chunks:
        return cls([t.view(-1) for t in tensors])

    def region(self, chunk_ids: Sequence[int]) -> list[torch.Tensor]:
        """Tensors covering ``chunk_ids`` (a contiguous run): one slice when flat."""
        if self.flat is not None:
            start, stop = self.bounds[chunk_ids[0]][0], self.bounds[chunk_ids[-1]][1]
            return [self.flat[start:stop]]
        return [self.pieces[c] for c in chunk_ids]


# ---------------------------------------------------------- instrumenting ----
@dataclass
class Traffic:
    """Bytes and messages this process sent inside :func:`count_traffic`."""

    bytes_sent: int = 0
    messages: int = 0
    by_schedule: dict[str, int] = field(default_factory=dict)

    def add(self, other: Traffic) -> None:
        """Add ``other``'s counts to these."""
        self.bytes_sent += other.bytes_sent
        self.messages += other.messages
        for key, n in other.by_schedule.items():
            self.by_schedule[key] = self.by_schedule.get(key, 0) + n


_traffic: contextvars.ContextVar[Traffic | None] = contextvars.ContextVar("traffic", default=None)


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the bytes this rank sends through distlab's collectives.

    >>> with count_traffic() as t:            # doctest: +SKIP
    ...     ring_all_reduce(x)
    >>> t.bytes_sent                           # doctest: +SKIP

    Counters nest: what an inner ``count_traffic`` counts is also added to
    the one around it when the inner one closes (a per-call trace inside a
    whole-step count, as :func:`distlab.parallel.comm_trace.trace_comm` does).
    """
    outer = _traffic.get()
    traffic = Traffic()
    token = _traffic.set(traffic)
    try:
        yield traffic
    finally:
        _traffic.reset(token)
        if outer is not None:
            outer.add(traffic)


def _record(schedule: Schedule, nbytes: int) -> None:
    traffic = _traffic.get()
    if traffic is not None and nbytes:
        traffic.bytes_sent += nbytes
        traffic.messages += 1
        key = f"{schedule.algorithm}_{schedule.collective}"
        traffic.by_schedule[key] = traffic.by_schedule.get(key, 0) + nbytes


# ----------------------------------------------------------------- groups ----
def group_info(group) -> tuple[int, int]:
    """(rank in group, group size); a clear error when no process group exists."""
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group: call inside distlab.run(...) or after distlab.init() / "
            "torch.distributed.init_process_group()"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def global_rank(group, rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


# -------------------------------------------------------- reference executor ----
def run_steps(
    schedule: Schedule, buffer: Chunks, *, op: str = "sum", group=None, out: Chunks | None = None
) -> None:
    """The reference executor: play ``schedule`` one step at a time (see the module docstring)."""
    rank, _ = group_info(group)
    out = buffer if out is None else out
    for step in schedule.steps:
        works, to_combine = [], []
        for t in step:
            if t.src == rank and t.dst == rank:  # all-to-all keeps its own block
                for dst, src in zip(out.region(t.landing), buffer.region(t.chunks)):
                    dst.copy_(src)
            elif t.src == rank:
                for piece in buffer.region(t.chunks):
                    if piece.numel():
                        works.append(dist.isend(piece, global_rank(group, t.dst), group))
                        _record(schedule, piece.numel() * piece.element_size())
            elif t.dst == rank:
                for piece in out.region(t.landing):
                    if piece.numel():
                        landing = torch.empty_like(piece) if t.reduce else piece
                        works.append(dist.irecv(landing, global_rank(group, t.src), group))
                        if t.reduce:
                            to_combine.append((piece, landing))
        for work in works:
            work.wait()
        for piece, landing in to_combine:
            combine_(piece, landing, op)


# ------------------------------------------------------------------ dispatch ----
#: engine names :func:`execute` accepts
ENGINES = ("auto", "reference", "pipelined", "step_by_step")


def execute(
    schedule: Schedule,
    buffer: Chunks,
    *,
    op: str = "sum",
    group=None,
    out: Chunks | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    engine: str = "auto",
    workspace: Workspace | None = None,
) -> None:
    """Play ``schedule`` on this rank: send, receive and reduce chunks in place.

    ``buffer`` holds the chunks this rank sends from (and, for in-place
    schedules, receives into); ``out`` is the receive side of out-of-place
    schedules (all-to-all). ``engine``: ``"reference"`` (:func:`run_steps`),
    ``"pipelined"`` (gloo's default), ``"step_by_step"`` (NCCL's: one batched
    call per step, segmented) or ``"auto"``. ``workspace`` holds the scratch the
    pipelined engine lands reduced data in; by default one kept per process.
    """
    from . import pipelined

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    rank, world_size = group_info(group)
    if schedule.world_size != world_size:
        raise ValueError(f"schedule is for {schedule.world_size} ranks, group has {world_size}")
    out = buffer if out is None else out
    sample = next((p for p in buffer.pieces if p.numel()), None)
    if sample is None:
        return
    if engine == "reference":
        run_steps(schedule, buffer, op=op, group=group, out=out)
        return
    segment_elems = max(1, segment_bytes // sample.element_size())
    messages = pipelined.segment_messages(schedule, rank, buffer, out, group, segment_elems)
    if engine == "auto":
        nccl = dist.get_backend(group) == "nccl"
        too_long = schedule.n_steps >= pipelined.MAX_PIPELINED_STEPS
        engine = "step_by_step" if nccl or too_long else "pipelined"
    if engine == "step_by_step":
        pipelined.run_step_by_step(messages, op, group)
    else:
        pipelined.run_pipelined(messages, op, group, sample, workspace or _default_workspace())


def _default_workspace() -> Workspace:
    """The process's scratch buffers, made on first use (see :class:`pipelined.Workspace`)."""
    from .pipelined import Workspace

    global _WORKSPACE
    if _WORKSPACE is None:
        _WORKSPACE = Workspace()
    return _WORKSPACE


_WORKSPACE: Workspace | None = None
