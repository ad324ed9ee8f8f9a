"""Run a :class:`~distlab.core.collective_schedule.CollectiveSchedule` on real processes.

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

import threading

import torch
import torch.distributed as dist

from distlab.core.collective_schedule import CollectiveSchedule

from . import pipelined
from .buffers import Chunks, Group, combine_, global_rank, group_info
from .pipelined import Workspace
from .traffic import record_sent

#: The pipelined engine cuts messages into pieces of at most this many bytes.
DEFAULT_SEGMENT_BYTES = 4 << 20


# -------------------------------------------------------- reference executor ----
def run_steps(
    schedule: CollectiveSchedule,
    buffer: Chunks,
    *,
    op: str = "sum",
    group: Group = None,
    out: Chunks | None = None,
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
                        record_sent(schedule, piece.numel() * piece.element_size())
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
    schedule: CollectiveSchedule,
    buffer: Chunks,
    *,
    op: str = "sum",
    group: Group = None,
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
    """This thread's scratch buffers, made on first use (see :class:`pipelined.Workspace`).

    One set per thread, not per process: FSDP and DDP run their collectives on a
    communication thread while the main thread runs tensor parallelism's, and two
    collectives sharing one scratch buffer would overwrite each other's data."""
    workspace = getattr(_WORKSPACES, "workspace", None)
    if workspace is None:
        workspace = _WORKSPACES.workspace = Workspace()
    return workspace


_WORKSPACES = threading.local()
