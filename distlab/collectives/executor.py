"""Run a :class:`~distlab.collectives.schedule.Schedule` on real processes.

One executor serves every algorithm. For each step, a rank

1. posts a non-blocking receive (``irecv``) for every message addressed to it
   and a non-blocking send (``isend``) for every message it sends, so sending
   and receiving overlap;
2. waits for the receives *in order* and reduces each one into its buffer as
   soon as it lands, while the later ones are still on the wire.

Large messages are cut into segments of ``segment_bytes`` so that step 2
really overlaps: the reduction of segment ``k`` runs while segment ``k + 1``
arrives. Only point-to-point operations are used; never a built-in
collective.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .schedule import Schedule, chunk_bounds

#: Messages are cut into pieces of at most this many bytes (see module docstring).
DEFAULT_SEGMENT_BYTES = 1 << 20

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


_traffic: contextvars.ContextVar[Traffic | None] = contextvars.ContextVar("traffic", default=None)


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the bytes this rank sends through distlab's collectives.

    >>> with count_traffic() as t:            # doctest: +SKIP
    ...     ring_all_reduce(x)
    >>> t.bytes_sent                           # doctest: +SKIP
    """
    traffic = Traffic()
    token = _traffic.set(traffic)
    try:
        yield traffic
    finally:
        _traffic.reset(token)


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


def _segments(t: torch.Tensor, segment_elems: int) -> list[torch.Tensor]:
    if t.numel() <= segment_elems:
        return [t]
    return list(t.split(segment_elems))


# --------------------------------------------------------------- executor ----
def execute(
    schedule: Schedule,
    buffer: Chunks,
    *,
    op: str = "sum",
    group=None,
    out: Chunks | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> None:
    """Play ``schedule`` on this rank: send, receive and reduce chunks in place.

    ``buffer`` holds the chunks this rank sends from (and, for in-place
    schedules, receives into); ``out`` is the receive side of out-of-place
    schedules (all-to-all).
    """
    rank, world_size = group_info(group)
    if schedule.world_size != world_size:
        raise ValueError(f"schedule is for {schedule.world_size} ranks, group has {world_size}")
    out = buffer if out is None else out
    element_size = buffer.pieces[0].element_size() if buffer.pieces else 1
    segment_elems = max(1, segment_bytes // element_size)
    nccl = dist.get_backend(group) == "nccl"

    for step in schedule.steps:
        recv_ops, landing = [], []
        send_ops = []
        for t in step:
            if t.src == rank and t.dst == rank:  # local copy (all-to-all's own block)
                for dst, src in zip(out.region(t.landing), buffer.region(t.chunks)):
                    dst.copy_(src)
            elif t.dst == rank:
                peer = global_rank(group, t.src)
                for dst in out.region(t.landing):
                    target = torch.empty_like(dst) if t.reduce else dst
                    for seg_in, seg_dst in zip(
                        _segments(target, segment_elems), _segments(dst, segment_elems)
                    ):
                        if seg_in.numel():
                            recv_ops.append(dist.P2POp(dist.irecv, seg_in, peer, group))
                            landing.append((seg_in, seg_dst, t.reduce))
            elif t.src == rank:
                peer = global_rank(group, t.dst)
                for src in buffer.region(t.chunks):
                    for seg in _segments(src, segment_elems):
                        if seg.numel():
                            send_ops.append(dist.P2POp(dist.isend, seg, peer, group))
                            _record(schedule, seg.numel() * seg.element_size())
        if not recv_ops and not send_ops:
            continue
        works = dist.batch_isend_irecv(recv_ops + send_ops)
        if nccl or len(works) != len(recv_ops) + len(send_ops):
            # NCCL coalesces a batch into one work: wait for all, then reduce.
            for w in works:
                w.wait()
            for received, dst, reduce in landing:
                if reduce:
                    combine_(dst, received, op)
            continue
        for w, (received, dst, reduce) in zip(works, landing):
            w.wait()
            if reduce:
                combine_(dst, received, op)  # overlaps with the segments still arriving
        for w in works[len(recv_ops):]:
            w.wait()
