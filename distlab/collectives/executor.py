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


# --------------------------------------------------------------- executor ----
# Reduced messages land in a scratch buffer before being added in. It is kept
# between calls, per (device, dtype), and grown when a bigger message comes:
# allocating tens of MiB afresh each step costs page faults that take as long
# as the transfer itself (NCCL and gloo keep such buffers too).
_workspace: dict[tuple, torch.Tensor] = {}


def workspace(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch tensor of at least ``numel`` elements, reused across calls."""
    key = (device, dtype)
    buf = _workspace.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _workspace[key] = buf
    return buf[:numel]


def release_workspace() -> None:
    """Free the scratch buffers (they are re-created when needed)."""
    _workspace.clear()


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
    sample = next((p for p in buffer.pieces if p.numel()), None)
    if sample is None:
        return
    segment_elems = max(1, segment_bytes // sample.element_size())
    ops = _segment_ops(schedule, rank, buffer, out, group, segment_elems)
    if dist.get_backend(group) == "nccl" or schedule.n_steps >= _MAX_PIPELINED_STEPS:
        _run_step_by_step(ops, op, group)
    else:
        _run_pipelined(ops, op, group, sample)


# ---------------------------------------------------- from steps to messages ----
_MAX_PIPELINED_STEPS = 512  # tags must fit in 31 bits: step << 22 | transfer << 12 | segment


@dataclass
class _Message:
    """One segment this rank sends or receives, and what must finish before it."""

    kind: str  # "send" or "recv"
    step: int
    peer: int
    tag: int
    tensor: torch.Tensor  # what is sent, or where the data finally goes
    region: tuple  # (side, piece, start, stop): which elements it reads/writes
    reduce: bool = False
    after: list = field(default_factory=list)  # messages that must be complete first
    landing: torch.Tensor | None = None  # scratch a reduced segment arrives in
    work: object = None
    done: bool = False


def _segment_ops(schedule, rank, buffer, out, group, segment_elems) -> list[_Message]:
    """Cut this rank's part of the schedule into segment messages, in step order,
    and record the data dependencies between them:

    * a send waits for the receives that wrote the data it sends (read after write);
    * a receive writes only after earlier sends of that region have finished
      (write after read) and earlier writes have landed (write after write).
    """
    messages: list[_Message] = []
    for step_index, step in enumerate(schedule.steps):
        for t_index, t in enumerate(step):
            if t.src == rank and t.dst == rank:  # all-to-all keeps its own block
                for dst, src in zip(out.region(t.landing), buffer.region(t.chunks)):
                    dst.copy_(src)
                continue
            if rank not in (t.src, t.dst):
                continue
            sending = t.src == rank
            chunks = buffer if sending else out
            ids = t.chunks if sending else t.landing
            side = "out" if (not sending and out is not buffer) else "in"
            for piece_index, tensor in enumerate(chunks.region(ids)):
                origin = _origin(chunks, ids, piece_index)
                for seg_index, (offset, seg) in enumerate(_offsets(tensor, segment_elems)):
                    if not seg.numel():
                        continue
                    tag = (step_index << 22) | (t_index << 12) | (seg_index & 0xFFF)
                    region = (side, origin[0], origin[1] + offset, origin[1] + offset + seg.numel())
                    peer = global_rank(group, t.dst if sending else t.src)
                    kind = "send" if sending else "recv"
                    messages.append(
                        _Message(kind, step_index, peer, tag, seg, region, t.reduce and not sending)
                    )
                    if sending:
                        _record(schedule, seg.numel() * seg.element_size())
    for i, m in enumerate(messages):
        for earlier in messages[:i]:
            if earlier.step == m.step or not _overlap(earlier.region, m.region):
                continue
            if m.kind == "send" and earlier.kind == "recv" or m.kind == "recv":
                m.after.append(earlier)
    return messages


def _origin(chunks: Chunks, ids, piece_index: int) -> tuple[int, int]:
    """(piece, offset) of a region's start, so regions can be compared."""
    if chunks.flat is not None:
        return 0, chunks.bounds[ids[0]][0]
    return ids[piece_index], 0


def _offsets(t: torch.Tensor, segment_elems: int):
    for offset in range(0, max(t.numel(), 1), segment_elems):
        yield offset, t[offset : offset + segment_elems]


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] == b[1] and a[2] < b[3] and b[2] < a[3]


# ------------------------------------------------------------- two engines ----
def _complete(m: _Message) -> bool:
    if not m.done and m.work is not None and m.kind == "send" and m.work.is_completed():
        m.work.wait()
        m.done = True
    return m.done


def _run_pipelined(messages: list[_Message], op: str, group, sample: torch.Tensor) -> None:
    """Post every message as soon as its dependencies allow, across step boundaries.

    Reduced data first lands in scratch (posted at once: no dependencies) and
    is added into place when its turn comes. We always *wait* for the first
    unfinished message in step order, so progress is exactly as safe as
    playing the steps one by one; posting early only adds overlap: step
    ``s + 1`` sends the first segment step ``s`` finished while the rest of
    step ``s`` is still arriving (a pipelined ring, as in NCCL and gloo).
    """
    scratch_elems = sum(m.tensor.numel() for m in messages if m.kind == "recv" and m.reduce)
    scratch = workspace(scratch_elems, sample.dtype, sample.device) if scratch_elems else None
    used = 0
    for m in messages:
        if m.kind == "recv" and m.reduce:
            m.landing = scratch[used : used + m.tensor.numel()]
            used += m.tensor.numel()
            m.work = dist.irecv(m.landing, m.peer, group, m.tag)
    unposted = [m for m in messages if m.work is None]
    for m in messages:
        unposted = _post_ready(unposted, group)
        m.work.wait()  # m's dependencies come earlier in step order: all done by now
        if m.kind == "recv" and m.reduce:
            combine_(m.tensor, m.landing, op)  # overlaps with messages still on the wire
        m.done = True


def _post_ready(unposted: list[_Message], group) -> list[_Message]:
    """Post, in order, every message whose dependencies have finished; return the rest."""
    still = []
    for m in unposted:
        if all(_complete(d) for d in m.after):
            post = dist.isend if m.kind == "send" else dist.irecv
            m.work = post(m.tensor, m.peer, group, m.tag)
        else:
            still.append(m)
    return still


def _run_step_by_step(messages: list[_Message], op: str, group) -> None:
    """One batch per step, waiting for all of it (NCCL, which runs a batch as one group call)."""
    for step in sorted({m.step for m in messages}):
        batch = [m for m in messages if m.step == step]
        p2p = []
        for m in batch:
            if m.kind == "recv" and m.reduce:
                m.landing = torch.empty_like(m.tensor)
                p2p.append(dist.P2POp(dist.irecv, m.landing, m.peer, group, m.tag))
            else:
                p2p.append(
                    dist.P2POp(
                        dist.isend if m.kind == "send" else dist.irecv,
                        m.tensor,
                        m.peer,
                        group,
                        m.tag,
                    )
                )
        for work in dist.batch_isend_irecv(p2p):
            work.wait()
        for m in batch:
            if m.kind == "recv" and m.reduce:
                combine_(m.tensor, m.landing, op)
