"""The fast engine under :func:`distlab.collectives.executor.execute`: segmented and pipelined.

The reference executor (:func:`~distlab.collectives.executor.run_steps`) plays one step at a
time. This engine gives the same result faster on large buffers:

1. every message is cut into segments of ``segment_bytes``, so the reduction of
   segment ``k`` runs while segment ``k + 1`` is still arriving;
2. a segment is posted as soon as the data it reads has landed, even if the
   rest of its step has not: step ``s + 1`` starts while step ``s`` finishes
   (a pipelined ring, as in NCCL and gloo);
3. small receives are *eager*: posted at the very start into scratch, and copied into
   place when their turn comes. gloo moves a message only once its receive is posted
   (the receiver tells the sender it is ready, then the data flows), so a receive posted
   late costs an extra trip across the wire; MPI libraries make the same split between
   small "eager" and large "rendezvous" messages. Large receives still land in place
   (a copy of megabytes would cost more than the trip it saves).

Each segment carries a tag ``step << 22 | transfer << 12 | segment``, so the two
ends match it however early it is posted. The dependency scan (which earlier
segment must finish before a segment may start) is the price; NCCL uses
:func:`run_step_by_step` instead, one batched group call per step.
Tests: tests/test_collective_engines.py plays every engine against the built-ins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.core.collective_schedule import CollectiveSchedule

from .buffers import Chunks, Group, combine_, global_rank
from .traffic import record_sent

MAX_PIPELINED_STEPS = 512  # tags must fit in 31 bits: step << 22 | transfer << 12 | segment
#: A receive of at most this many bytes that must wait for earlier messages (it overwrites
#: data an earlier send still reads) is posted at once into scratch instead: point 3 above.
EAGER_BYTES = 256 << 10


class Workspace:
    """Scratch buffers reduced messages land in, kept per (device, dtype) and grown on demand.

    Allocating tens of MiB afresh each call costs page faults that take as long as
    the transfer itself (NCCL and gloo keep such buffers too), so a caller that
    runs many collectives passes one ``Workspace`` to each call.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A scratch tensor of at least ``numel`` elements."""
        key = (device, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:numel]

    def clear(self) -> None:
        """Free the buffers (they are re-created when needed)."""
        self._buffers.clear()


# ---------------------------------------------------- from steps to messages ----


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


def segment_messages(
    schedule: CollectiveSchedule,
    rank: int,
    buffer: Chunks,
    out: Chunks,
    group: Group,
    segment_elems: int,
) -> list[_Message]:
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
                        record_sent(schedule, seg.numel() * seg.element_size())
    _add_dependencies(messages, segment_elems)
    return messages


def _add_dependencies(messages: list[_Message], block: int) -> None:
    """Fill each message's ``after`` with the earlier messages (other steps) it conflicts with.

    A send conflicts with earlier receives of an overlapping region; a receive with any
    earlier message of an overlapping region. Comparing every pair costs O(M^2) for M
    messages; instead each region is filed under the ``block``-element blocks it touches
    (a segment spans at most two), so a message meets only the earlier messages of its own
    blocks: O(M x messages per block), linear in the buffer size.
    """
    by_block: dict[tuple, list[_Message]] = {}
    for m in messages:
        side, piece, start, stop = m.region
        keys = [(side, piece, b) for b in range(start // block, (stop - 1) // block + 1)]
        candidates = {id(e): e for key in keys for e in by_block.get(key, ())}
        for earlier in candidates.values():
            if earlier.step == m.step or not _overlap(earlier.region, m.region):
                continue
            if m.kind == "recv" or earlier.kind == "recv":
                m.after.append(earlier)
        for key in keys:
            by_block.setdefault(key, []).append(m)


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


# ----------------------------------------------------------------- engines ----
def _complete(m: _Message) -> bool:
    if not m.done and m.work is not None and m.kind == "send" and m.work.is_completed():
        m.work.wait()
        m.done = True
    return m.done


def run_pipelined(
    messages: list[_Message], op: str, group: Group, sample: torch.Tensor, workspace: Workspace
) -> None:
    """Post every message as soon as its dependencies allow, across step boundaries.

    Reduced data, and small receives that would overwrite data still to be sent
    (:data:`EAGER_BYTES`), first land in scratch (posted at once: nothing to wait for)
    and are added or copied into place when their turn comes. We always *wait* for the
    first unfinished message in step order, so progress is exactly as safe as playing
    the steps one by one; posting early only adds overlap: step ``s + 1`` sends the
    first segment step ``s`` finished while the rest of step ``s`` is still arriving (a
    pipelined ring, as in NCCL and gloo).
    """
    early = [m for m in messages if m.kind == "recv" and _lands_in_scratch(m, sample)]
    scratch_elems = sum(m.tensor.numel() for m in early)
    scratch = workspace.get(scratch_elems, sample.dtype, sample.device) if scratch_elems else None
    used = 0
    for m in early:
        m.landing = scratch[used : used + m.tensor.numel()]
        used += m.tensor.numel()
        m.work = dist.irecv(m.landing, m.peer, group, m.tag)
    unposted = [m for m in messages if m.work is None]
    for m in messages:
        unposted = _post_ready(unposted, group)
        m.work.wait()  # m's dependencies come earlier in step order: all done by now
        if m.reduce:
            combine_(m.tensor, m.landing, op)  # overlaps with messages still on the wire
        elif m.landing is not None:
            m.tensor.copy_(m.landing)  # an eager receive: into place, now that it may
        m.done = True


def _lands_in_scratch(m: _Message, sample: torch.Tensor) -> bool:
    """A receive posted at the start: one that reduces, or a small one that must otherwise
    wait (point 3 of the module docstring)."""
    small = m.tensor.numel() * sample.element_size() <= EAGER_BYTES
    return m.reduce or (bool(m.after) and small)


def _post_ready(unposted: list[_Message], group: Group) -> list[_Message]:
    """Post, in order, every message whose dependencies have finished; return the rest."""
    still = []
    for m in unposted:
        if all(_complete(d) for d in m.after):
            post = dist.isend if m.kind == "send" else dist.irecv
            m.work = post(m.tensor, m.peer, group, m.tag)
        else:
            still.append(m)
    return still


def run_step_by_step(messages: list[_Message], op: str, group: Group) -> None:
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
