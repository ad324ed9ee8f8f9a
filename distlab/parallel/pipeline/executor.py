"""Run a pipeline schedule on real processes, one action at a time.

Each rank walks its list of actions (:mod:`distlab.core.pipeline_schedule`,
sends and receives inserted by ``with_communication``) and does exactly what
each one says:

* ``RF``: receive the input activation of a chunk from the previous stage's rank;
* ``F``: run the chunk forward (the first stage reads the tokens, the last one
  returns the loss divided by m), keep its input and output for the backward
  (and the chunk's side loss, ``PipelineStage.side_loss``, also divided by m);
* ``SF``: send the output to the next stage's rank (non-blocking ``isend``);
* ``RB``: receive the gradient of the chunk's output from the next stage;
* ``B``: backward through the chunk, accumulating weight gradients; ``I``:
  only the gradient of the chunk's input (``torch.autograd.grad``), ``W``:
  only the weight gradients, later (``backward(inputs=weights)`` re-walks the
  chunk's graph, so on this executor I + W costs more than B: real
  zero-bubble code splits every layer's backward in two instead);
* ``SB``: send the input's gradient to the previous stage.

Every message is a small header (the tensor's shape and dtype) and then the
tensor, tagged with the micro-batch and virtual stage, so a stage needs no
shapes in advance and a mismatch is reported by name. Gradients of the m
micro-batches add up in ``.grad`` (each loss is divided by m), so one step
equals single-process training on the whole batch.

The schedule is checked (complete, deadlock-free) before anything runs, and
an action that raises is reported by global rank with its place in the
pipeline, as ``rank 5 [stage 1 of pp group (1, 5)]: action 0F3 ...``; the
launcher then stops every rank, so a failure never hangs the others.

Memory: each ``F`` counts the storages autograd saves for that forward (each once,
views included; parameters are model state, not counted), and the rank holds them until
the matching ``B`` (or ``W``). A storage that several held forwards save is counted once
while any of them holds it: under ``torch.autocast`` every micro-batch's linears save the
same cached 16-bit copy of a weight, one tensor in memory however many micro-batches are
in flight. The rank keeps a reference to each storage it counts until that backward,
so one that autograd dropped early (the MoE balancing loss's, when the loss is unused)
cannot free its address for another to be mistaken for it. ``peak_activation_bytes``
is the most held at once.

Timing: every compute action records its start and end on the machine's
monotonic clock (shared by all processes), so the ranks' timelines line up.
``fixed_cost`` adds a known sleep per action (seconds per whole stage; a
chunk of an interleaved schedule sleeps 1/v of it): on a busy 2-core laptop
the real compute of a tiny GPT is too small and too noisy to show a bubble,
a sleep is neither (it uses no core).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distlab.core.pipeline_schedule import Action, PipelineSchedule, with_communication
from distlab.parallel.comm.trace import record_p2p
from distlab.sim.pipeline_replay import TimedAction, Timeline, check

from .stage import PipelineStage

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_HEADER = 8  # ndim, dtype index, up to 6 sizes


class PipelineError(RuntimeError):
    """An action failed; the message names the global rank, its stage in the pp group
    (``rank 5 [stage 1 of pp group (1, 5)]``) and the action."""


def _who(me: int, stage: int, peers: Sequence[int]) -> str:
    """``rank 5 [stage 1 of pp group (1, 5)]``: global rank ``me``, stage ``stage`` of the
    pipeline whose stages run on global ranks ``peers``."""
    return f"rank {me} [stage {stage} of pp group ({', '.join(map(str, peers))})]"


@dataclass
class RankRun:
    """What one rank measured during one step."""

    rank: int
    entries: list[TimedAction]
    loss: float | None  # this rank's part of the step's loss: the micro-batch losses / m on
    # the last stage's rank, plus any side losses / m; None on a rank that computed no loss
    peak_in_flight: int
    peak_pending_weight_grads: int
    peak_activation_bytes: int
    activation_bytes: dict[int, int]  # chunk -> bytes one micro-batch's forward saves


def measured_timeline(schedule: PipelineSchedule, runs: list[RankRun]) -> Timeline:
    """One :class:`Timeline` from every rank's :class:`RankRun` (times from the earliest start)."""
    entries = [e for run in runs for e in run.entries]
    t0 = min(e.start for e in entries)
    shifted = tuple(TimedAction(e.rank, e.action, e.start - t0, e.end - t0) for e in entries)
    busy = tuple(sum(e.end - e.start for e in run.entries) for run in runs)
    return Timeline(
        schedule,
        shifted,
        max(e.end for e in shifted),
        busy,
        tuple(run.peak_in_flight for run in runs),
        tuple(run.peak_pending_weight_grads for run in runs),
    )


def run_pipeline(
    schedule: PipelineSchedule,
    stage: PipelineStage,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    fixed_cost: dict[str, float] | None = None,
    stage_ranks: Sequence[int] | None = None,
) -> RankRun:
    """Run this rank's actions of ``schedule`` for one step on the whole batch
    ``inputs``/``targets`` (cut into ``schedule.micro_batches`` micro-batches).
    Gradients accumulate into the stage's parameters; step the optimizer after.

    ``stage_ranks``: the global ranks of the pipeline's stages, in stage order
    (``mesh.ranks("pp")`` in a 3D job); the default is the whole job, stage r
    on rank r. ``stage.rank`` is this rank's index in that list.

    Errors name this rank by its global rank and its stage in the pipeline
    (:class:`PipelineError` for a failed action).

    Any ``stage_to_rank`` runs (loop or V): the stage must hold the virtual
    stages the schedule gives its rank, the loss is on the rank that holds the
    last one (rank 0 for a V), and two neighbouring stages on the same rank
    (the turn of a V) hand their tensor over in memory, with no message. A
    bidirectional schedule (DualPipe) reads each micro-batch's tokens and
    computes its loss at the ends of its own route (:meth:`PipelineSchedule.route`), so
    ranks 0 and p - 1 each hold part of the loss; each rank then adds its
    mirror's gradients (``gpt_stage(..., bidirectional=True)``)."""
    check(schedule)  # raises ScheduleError naming the rank and action
    m = schedule.micro_batches
    if inputs.shape[0] % m or inputs.shape[0] < m:
        raise ValueError(f"batch of {inputs.shape[0]} cannot be cut into m={m} equal micro-batches")
    me = dist.get_rank()
    peers = list(range(dist.get_world_size())) if stage_ranks is None else list(stage_ranks)
    if me not in peers:
        raise ValueError(f"rank {me} is not in the pipeline's stage_ranks {peers}")
    rank = peers.index(me)
    if (
        schedule.stages != len(peers)
        or schedule.chunks != stage.num_chunks
        or stage.rank != rank
        or stage.stages != schedule.stages
    ):
        raise ValueError(
            f"rank {me}: schedule has {schedule.stages} stages x {schedule.chunks} chunks, "
            f"the pipeline {len(peers)} ranks {peers}, this rank is stage {rank}, "
            f"the stage says stage {stage.rank} of {stage.stages} with {stage.num_chunks} "
            "chunks; cut the model for the schedule's number of stages"
        )
    held = tuple(stage.virtual_stage(c) for c in range(stage.num_chunks))
    wanted = tuple(schedule.virtual_stage(rank, c) for c in range(schedule.chunks))
    if schedule.bidirectional != (stage.mirror is not None):
        raise ValueError(
            f"{_who(me, rank, peers)}: the schedule is "
            f"{'' if schedule.bidirectional else 'not '}bidirectional "
            f"but the stage {'has no' if stage.mirror is None else 'has a'} mirror; cut the "
            f"model with gpt_stage(..., bidirectional={schedule.bidirectional})"
        )
    if held != wanted:
        raise ValueError(
            f"{_who(me, rank, peers)}: the schedule ({schedule.placement} placement) gives this "
            f"stage virtual stages {wanted}, the stage holds {held}; cut the model with "
            f"gpt_stage(..., placement={schedule.placement!r})"
        )
    _agree(schedule, inputs, targets, peers, rank, stage)
    # each micro-batch a copy of its own, so the bytes autograd saves for it are its own
    micro_inputs = [t.clone() for t in inputs.chunk(m)]
    runner = _Runner(schedule, stage, micro_inputs, targets.chunk(m), fixed_cost or {}, peers)
    for action in with_communication(schedule).ranks[rank]:
        try:
            runner.do(action)
        except Exception as error:
            raise PipelineError(
                f"{_who(me, rank, peers)}: action {action} ({_WHAT[action.kind]} of micro-batch "
                f"{action.micro_batch}, chunk {action.chunk}) failed: {error}"
            ) from error
    return runner.finish()


_AGREE_TAG = (1 << 30) + 1  # apart from the schedule's tags and the tied-weight exchange


def _agree(schedule, inputs, targets, peers: list[int], rank: int, stage: PipelineStage) -> None:
    """Every stage tells every other what step it is about to run (stages, chunks, m, batch,
    a checksum of the schedule's actions) before any action, so ranks that built different
    schedules (another ``micro_batches`` on one rank) all raise the same ``ValueError``
    naming each rank's values, instead of failing later in one rank's loss or hanging.
    p - 1 messages of 6 integers per rank per step; not recorded in the traffic trace."""
    if len(peers) == 1:
        return
    checksum = zlib.crc32(repr(schedule.ranks).encode())
    mine = [schedule.stages, schedule.chunks, schedule.micro_batches]
    mine += [inputs.shape[0], targets.shape[0], checksum]
    params = stage.parameters()
    device = params[0].device if params else torch.device("cpu")
    sent = torch.tensor(mine, dtype=torch.int64, device=device)
    works = [dist.isend(sent, peer, tag=_AGREE_TAG) for i, peer in enumerate(peers) if i != rank]
    seen = {}
    for i, peer in enumerate(peers):
        if i == rank:
            seen[i] = mine
            continue
        theirs = torch.empty_like(sent)
        dist.recv(theirs, peer, tag=_AGREE_TAG)
        seen[i] = theirs.tolist()
    for work in works:
        work.wait()
    if any(values != mine for values in seen.values()):
        each = "; ".join(
            f"stage {i} (rank {peers[i]}): {v[0]} stages x {v[1]} chunks, micro_batches={v[2]}, "
            f"batch {v[3]} (targets {v[4]}), schedule checksum {v[5]:08x}"
            for i, v in seen.items()
        )
        raise ValueError(
            f"the pipeline's ranks are about to run different steps: {each}. Build the same "
            "schedule (same micro_batches) and give the same batch size on every rank"
        )


_WHAT = {
    "F": "forward",
    "B": "backward",
    "I": "input-gradient backward",
    "W": "weight-gradient backward",
    "SF": "send activation",
    "RF": "receive activation",
    "SB": "send gradient",
    "RB": "receive gradient",
}


def _own_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every module's own parameters, module by module (an FSDP wrapper's ``parameters()``
    are its shards; the wrapped modules' own parameters are views into the unit's gathered
    buffer while it is gathered)."""
    return [p for mod in module.modules() for p in mod.parameters(recurse=False)]


def _weight_storages(params: list[torch.nn.Parameter]) -> set[int]:
    """The storages ``params`` live in at this moment: FSDP frees a unit's gathered buffer
    after its forward and gathers it again for the backward, so the objects stay and the
    storages move."""
    return {p.untyped_storage().data_ptr() for p in params} - {0}


class _Runner:
    """One rank's state during a step: stashed activations, received tensors, open sends."""

    def __init__(self, schedule, stage, inputs, targets, fixed_cost, peers) -> None:
        self.schedule, self.stage, self.peers = schedule, stage, peers
        self.inputs, self.targets = inputs, targets
        self.m, self.v = schedule.micro_batches, schedule.chunks
        self.sleep = {k: s * schedule.chunk_share for k, s in fixed_cost.items()}
        params = stage.parameters()
        self.device = params[0].device if params else torch.device("cpu")
        self.model_state = {p.untyped_storage().data_ptr() for p in params}
        self.received: dict[tuple[str, int, int], torch.Tensor] = {}
        self.stash: dict[tuple[int, int], tuple] = {}  # (chunk, mb) -> (input, output)
        self.sends: list = []  # open isend works
        self.sent: list[torch.Tensor] = []  # their tensors, alive until the sends complete
        self.entries: list[TimedAction] = []
        self.loss, self.has_loss = 0.0, False
        self.held = self.pending = self.held_bytes = 0
        self.peaks = [0, 0, 0]
        self.activation_bytes: dict[int, int] = {}
        self.holders: dict[int, int] = {}  # storage address -> how many held forwards saved it

    # -- messages ---------------------------------------------------------------
    def _tag(self, kind: str, j: int, i: int) -> int:
        return 4 * (i * self.schedule.stages * self.v + j) + (0 if kind == "act" else 2)

    def _send(self, tensor: torch.Tensor, to_stage: int, tag: int) -> None:
        tensor = tensor.detach().contiguous()
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        header[0], header[1] = tensor.dim(), _DTYPES.index(tensor.dtype)
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
        peer = self.peers[self.schedule.rank_of(to_stage)]
        self.sends += [dist.isend(header, peer, tag=tag), dist.isend(tensor, peer, tag=tag + 1)]
        self.sent += [header, tensor]
        record_p2p("send header", "pp", len(self.peers), header)
        record_p2p("send", "pp", len(self.peers), tensor)

    def _recv(self, from_stage: int, tag: int) -> torch.Tensor:
        peer = self.peers[self.schedule.rank_of(from_stage)]
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        dist.recv(header, peer, tag=tag)
        ndim, dtype = int(header[0]), _DTYPES[int(header[1])]
        tensor = torch.empty(header[2 : 2 + ndim].tolist(), dtype=dtype, device=self.device)
        dist.recv(tensor, peer, tag=tag + 1)
        record_p2p("recv header", "pp", len(self.peers), header)
        record_p2p("recv", "pp", len(self.peers), tensor)
        return tensor

    # -- actions ----------------------------------------------------------------
    def _local(self, a: Action, j: int) -> bool:
        """Hand a tensor to a neighbouring stage on this same rank (the turn of a V):
        a send stores it where that stage's receive will find it, the receive does
        nothing. True if ``a`` is such a message."""
        peer = j + 1 if a.kind in ("SF", "RB") else j - 1
        if self.schedule.rank_of(peer) != self.stage.rank:
            return False
        if a.kind in ("SF", "SB"):
            chunk = self.schedule.chunk_of(peer)
            if a.kind == "SF":
                tensor, key = self.stash[(a.chunk, a.micro_batch)][1][0], "act"
            else:
                tensor, key = self.received.pop(("input_grad", a.chunk, a.micro_batch)), "grad"
            self.received[(key, chunk, a.micro_batch)] = tensor.detach().clone()
        return True

    def do(self, a: Action) -> None:
        c, i = a.chunk, a.micro_batch
        j = self.stage.virtual_stage(c)
        if a.kind in ("SF", "RF", "SB", "RB") and self._local(a, j):
            pass
        elif a.kind == "RF":
            self.received[("act", c, i)] = self._recv(j - 1, self._tag("act", j - 1, i))
        elif a.kind == "RB":
            self.received[("grad", c, i)] = self._recv(j + 1, self._tag("grad", j + 1, i))
        elif a.kind == "SF":
            self._send(self.stash[(c, i)][1][0], j + 1, self._tag("act", j, i))
        elif a.kind == "SB":
            self._send(self.received.pop(("input_grad", c, i)), j - 1, self._tag("grad", j, i))
        else:
            start = time.monotonic()
            getattr(self, f"_{a.kind}")(c, i)
            if a.kind in self.sleep:
                time.sleep(self.sleep[a.kind])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.entries.append(TimedAction(self.stage.rank, a, start, time.monotonic()))
        self.peaks = [
            max(p, n) for p, n in zip(self.peaks, (self.held, self.pending, self.held_bytes))
        ]

    def _ends(self, c: int, i: int) -> tuple[bool, bool]:
        """Is chunk c the first, the last stage of micro-batch i's route?"""
        j, (first, last) = self.stage.virtual_stage(c), self.schedule.route(i)
        return j == first, j == last

    def _F(self, c: int, i: int) -> None:
        if self._ends(c, i)[0]:
            x = self.inputs[i].to(self.device)
        else:
            x = self.received.pop(("act", c, i)).requires_grad_(True)
        saved: dict[int, tuple[torch.UntypedStorage, int]] = {}  # address -> (storage, bytes)
        chunk = self.stage.chunks[c]
        params = _own_parameters(chunk)  # once per forward, not once per saved tensor

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            # a weight is model state, and so is a view of one (linear saves weight.t()):
            # the stage's own parameters, and the weights a chunk uses now, which under
            # FSDP are views into a gathered buffer (freed after the forward, gathered
            # again for the backward), looked up when a tensor is not one of the former
            weight = (
                ptr in self.model_state
                or isinstance(t, torch.nn.Parameter)
                or ptr in _weight_storages(params)
            )
            if not weight:  # kept until the backward: while held, no other takes its address
                storage = t.untyped_storage()
                saved[ptr] = (storage, storage.nbytes())
            return t

        side = None
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = self.stage.chunks[c](x)
            if self._ends(c, i)[1]:
                out = self.stage.loss_fn(out, self.targets[i].to(self.device)) / self.m
                self.loss += float(out.detach())
                self.has_loss = True
            if self.stage.side_loss is not None and (side := self.stage.side_loss(c)) is not None:
                side = side / self.m
                self.loss += float(side.detach())
                self.has_loss = True
        self.activation_bytes[c] = sum(nbytes for _, nbytes in saved.values())
        self.stash[(c, i)] = (x, (out, side), saved)
        self.held += 1
        self._hold(saved)

    def _hold(self, saved: dict[int, tuple]) -> None:
        """Add a forward's saved storages to what the rank holds, each storage once."""
        for ptr, (_, nbytes) in saved.items():
            if self.holders.get(ptr, 0) == 0:
                self.held_bytes += nbytes
            self.holders[ptr] = self.holders.get(ptr, 0) + 1

    def _release(self, saved: dict[int, tuple]) -> None:
        """A forward's backward is done: drop the storages no held forward saves any more."""
        for ptr, (_, nbytes) in saved.items():
            self.holders[ptr] -= 1
            if self.holders[ptr] == 0:
                del self.holders[ptr]
                self.held_bytes -= nbytes

    def _output_grad(self, c: int, i: int, roots: tuple) -> tuple[list, list]:
        """What backward starts from: the chunk's output (or loss) and its side loss, if
        any, with their gradients (the received one; ``None``, i.e. 1, for a loss)."""
        out, side = roots
        grad = None
        if not self._ends(c, i)[1]:
            grad = self.received.pop(("grad", c, i))
            if grad.shape != out.shape:
                raise ValueError(
                    f"received a gradient of shape {tuple(grad.shape)} for an output of shape "
                    f"{tuple(out.shape)}: the next stage disagrees on shapes"
                )
        if side is None:
            return [out], [grad]
        return [out, side], [grad, None]

    def _B(self, c: int, i: int) -> None:
        x, roots, saved = self.stash.pop((c, i))
        torch.autograd.backward(*self._output_grad(c, i, roots))
        if not self._ends(c, i)[0]:
            self.received[("input_grad", c, i)] = x.grad
        self.held -= 1
        self._release(saved)

    def _I(self, c: int, i: int) -> None:
        x, roots, saved = self.stash[(c, i)]
        outputs, grads = self._output_grad(c, i, roots)
        self.stash[(c, i)] = (x, (outputs, grads), saved)
        if not self._ends(c, i)[0]:
            (self.received[("input_grad", c, i)],) = torch.autograd.grad(
                outputs, x, grads, retain_graph=True
            )
        self.held -= 1
        self.pending += 1

    def _W(self, c: int, i: int) -> None:
        _, (outputs, grads), saved = self.stash.pop((c, i))
        weights = [p for p in self.stage.chunks[c].parameters() if p.requires_grad]
        torch.autograd.backward(outputs, grads, inputs=weights)
        self.pending -= 1
        self._release(saved)

    # -- end of step ------------------------------------------------------------
    def finish(self) -> RankRun:
        for work in self.sends:
            work.wait()
        self.sends, self.sent = [], []
        self._sum_tied_gradients()
        self._sum_mirror_gradients()
        return RankRun(
            self.stage.rank,
            self.entries,
            self.loss if self.has_loss else None,
            self.peaks[0],
            self.peaks[1],
            self.peaks[2],
            self.activation_bytes,
        )

    def _sum_mirror_gradients(self) -> None:
        """DualPipe: this rank and its mirror hold the same model parts, one copy per
        direction; each adds the other's gradients, parameter by parameter."""
        if self.stage.mirror is None:
            return
        peer = self.peers[self.stage.mirror]
        for p in self.stage.parameters():
            mine = p.grad if p.grad is not None else torch.zeros_like(p)
            theirs = torch.empty_like(mine)
            work = dist.isend(mine.contiguous(), peer, tag=(1 << 30) + 2)
            dist.recv(theirs, peer, tag=(1 << 30) + 2)
            work.wait()
            record_p2p("send", "dualpipe mirror", 2, mine)
            record_p2p("recv", "dualpipe mirror", 2, theirs)
            p.grad = mine + theirs

    def _sum_tied_gradients(self) -> None:
        """Stages 0 and p - 1 add each other's part of a shared weight's gradient."""
        peer = None if self.stage.tied_peer is None else self.peers[self.stage.tied_peer]
        for p in self.stage.tied:
            mine = p.grad if p.grad is not None else torch.zeros_like(p)
            theirs = torch.empty_like(mine)
            work = dist.isend(mine.contiguous(), peer, tag=1 << 30)
            dist.recv(theirs, peer, tag=1 << 30)
            work.wait()
            record_p2p("send", "embedding", 2, mine)
            record_p2p("recv", "embedding", 2, theirs)
            p.grad = mine + theirs
