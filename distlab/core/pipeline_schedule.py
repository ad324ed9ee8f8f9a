"""Pipeline schedules as data: one type that is executed, simulated, counted and drawn.

A schedule is, for each of the p ranks, the ordered list of actions it runs.
An action is a kind, a model chunk and a micro-batch, written ``{chunk}{kind}{micro_batch}``:

======  ==========================================================  ============
kind    what the rank does                                          example
======  ==========================================================  ============
``F``   forward of the micro-batch through the chunk                ``0F3``
``B``   whole backward (input and weight gradients)                 ``0B3``
``I``   backward for the input gradient only (ZB's "B")             ``1I0``
``W``   backward for the weight gradients only (ZB's "W")           ``1W0``
``SF``  send the chunk's output activation to the next stage        ``0SF3``
``RF``  receive the chunk's input activation from the previous one  ``0RF3``
``SB``  send the input gradient to the previous stage               ``0SB3``
``RB``  receive the output gradient from the next stage             ``0RB3``
======  ==========================================================  ============

This is torchtitan's ``0F0``/``0B0``/``0W0`` notation with our own names for
the split backward (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Section 2,
call the input-gradient pass B; we call it ``I`` so that ``B`` always means
the whole backward).

Which virtual stage a chunk is comes from the schedule's ``stage_to_rank``
mapping (entry j is the rank that holds virtual stage j; torch calls it
``stage_index_to_group_rank``), and chunk c of rank r is the c-th lowest
stage that rank holds. Two mappings have names:

* ``"loop"`` (the default, Narayanan et al. 2021, Section 2.2.2): chunk c of
  rank r is stage ``j = c p + r``; with one chunk rank r is stage r.
* ``"v"`` (Qi et al. 2024, Section 6, ZB-V): the stages go down the ranks
  and back up, so with two chunks rank r holds stages r and 2p - 1 - r, and
  the last rank runs stages p - 1 and p back to back with no message.

Schedules are usually written with compute actions only; the sends and
receives are implied by the dependencies, and :func:`with_communication`
inserts them (a receive just before the action that needs it, a
non-blocking send just after the action that produced it). A hand-written
schedule may also spell them out; :func:`~distlab.sim.pipeline_replay.check` then proves that every
send has its receive.

``str(schedule)`` prints one line per rank, ``"rank 0: 0F0 0F1 0B0 0B1"``,
and :meth:`PipelineSchedule.parse` reads that text back, so a student can write a
schedule by hand and have it checked, simulated and run.

Pure Python (no torch): :mod:`distlab.sim.pipeline_replay` checks and times
it, :mod:`distlab.calc.pipeline` counts bubbles with it,
:mod:`distlab.sim.pipeline` adds link costs, :mod:`distlab.parallel.pipeline`
runs it on real processes, :mod:`distlab.viz.pipeline_plots` draws it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from .checks import nonnegative_int, positive_int
from .renamed import old_names

#: The most pipeline stages (ranks) a schedule is built for; far beyond real pipelines
#: (tens of stages), and small enough that a replay stays within seconds.
MAX_STAGES = 256
#: The most slots, stages x micro-batches x chunks, a schedule is built for: each slot is
#: one forward and one or two backward actions, so a schedule holds at most ~200,000.
MAX_SLOTS = 65_536
COMPUTE_KINDS = ("F", "B", "I", "W")
COMM_KINDS = ("SF", "RF", "SB", "RB")
KINDS = COMPUTE_KINDS + COMM_KINDS
_ACTION = re.compile(r"^(\d+)(SF|RF|SB|RB|F|B|I|W)(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank: ``kind`` (see the module table) of ``micro_batch`` through ``chunk``."""

    chunk: int
    kind: str
    micro_batch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        for name in ("chunk", "micro_batch"):
            value = getattr(self, name)
            nonnegative_int(f"action {name}", value)

    def __str__(self) -> str:
        return f"{self.chunk}{self.kind}{self.micro_batch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """``Action.parse("1B3")`` is chunk 1, backward, micro-batch 3."""
        match = _ACTION.match(text.strip())
        if match is None:
            raise ValueError(
                f"cannot read action {text!r}; write chunk, kind, micro-batch, e.g. '0F3' or "
                f"'1SB0' (kinds: {', '.join(KINDS)})"
            )
        return cls(int(match[1]), match[2], int(match[3]))


def stage_to_rank(stages: int, chunks: int, placement: str = "loop") -> tuple[int, ...]:
    """The rank of each of the p v virtual stages: ``"loop"`` gives stage j to rank
    j mod p; ``"v"`` walks the ranks down and back up, so stage j of block
    b = j // p goes to rank j mod p when b is even and p - 1 - j mod p when b is
    odd (torch's ``generate_stage_to_rank_mapping(style="v")``). At most
    :data:`MAX_STAGES` stages and :data:`MAX_SLOTS` virtual stages."""
    p, _, v = check_size(stages, 1, chunks)
    if placement == "loop":
        return tuple(j % p for j in range(p * v))
    if placement == "v":
        return tuple(j % p if (j // p) % 2 == 0 else p - 1 - j % p for j in range(p * v))
    raise ValueError(f"unknown placement {placement!r}; allowed: 'loop', 'v'")


@dataclass(frozen=True)
class PipelineSchedule:
    """``ranks[r]`` is rank r's actions in order; ``chunks`` (v) model chunks per rank.

    ``micro_batches`` (m) defaults to one more than the largest micro-batch
    index used; give it to have actions outside 0..m-1 reported by the checker.
    ``stage_to_rank[j]`` is the rank that holds virtual stage j (default: the
    loop mapping, see :func:`stage_to_rank`); chunk c of a rank is the c-th
    lowest stage it holds.

    ``bidirectional`` (DualPipe): the n = p v virtual stages are two pipelines
    of n/2 stages, each a copy of the whole model cut in n/2 parts (stage j
    holds part j mod n/2); the first m/2 micro-batches go through stages
    0..n/2-1, the others through n/2..n-1 (:meth:`route`).
    """

    ranks: tuple[tuple[Action, ...], ...]
    chunks: int = 1
    name: str = field(default="custom", compare=False)
    micro_batches: int = field(default=None, kw_only=True)  # type: ignore[assignment]
    stage_to_rank: tuple[int, ...] = field(default=None, kw_only=True)  # type: ignore[assignment]
    bidirectional: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        if not self.ranks:
            raise ValueError("a schedule needs at least one rank's actions")
        positive_int("chunks", self.chunks)
        object.__setattr__(self, "ranks", tuple(tuple(r) for r in self.ranks))
        for r, acts in enumerate(self.ranks):
            for a in acts:
                if not isinstance(a, Action):
                    raise TypeError(
                        f"rank {r}: {a!r} is not an Action; use Action.parse({str(a)!r}) "
                        "or PipelineSchedule.parse for text"
                    )
        if self.micro_batches is None:
            used = 1 + max((a.micro_batch for r in self.ranks for a in r), default=-1)
            object.__setattr__(self, "micro_batches", used)
        else:
            positive_int("micro_batches", self.micro_batches)
        p, v = len(self.ranks), self.chunks
        mapping = self.stage_to_rank
        if mapping is None:
            mapping = stage_to_rank(p, v)
        object.__setattr__(self, "stage_to_rank", tuple(mapping))
        _check_mapping(self.stage_to_rank, p, v)
        if self.bidirectional and (p * v % 2 or self.micro_batches % 2):
            raise ValueError(
                f"a bidirectional schedule needs an even number of virtual stages and of "
                f"micro-batches; got {p * v} stages, micro_batches={self.micro_batches}"
            )

    def route(self, micro_batch: int) -> tuple[int, int]:
        """(first, last) virtual stage that micro-batch ``micro_batch`` goes through: 0 and
        p v - 1, or for a bidirectional schedule one half of the stages (see the class)."""
        n = self.stages * self.chunks
        if not self.bidirectional:
            return 0, n - 1
        return (0, n // 2 - 1) if micro_batch < self.micro_batches // 2 else (n // 2, n - 1)

    @property
    def chunk_share(self) -> float:
        """The share of a whole stage's work (L/p layers) one chunk holds: 1/v, or 2/v for
        a bidirectional schedule, whose 2 chunks are each a whole stage of one copy."""
        return (2 if self.bidirectional else 1) / self.chunks

    def model_part(self, virtual_stage: int) -> int:
        """Which part of the model (cut in p v parts, or p v / 2 if bidirectional) stage j runs."""
        n = self.stages * self.chunks
        return virtual_stage % (n // 2) if self.bidirectional else virtual_stage

    @property
    def stages(self) -> int:
        """p, the number of ranks."""
        return len(self.ranks)

    def chunk_switches(self, rank: int = 0) -> int:
        """How often ``rank`` moves from one of its chunks to another in one step: under
        ZeRO-3/FSDP each move gathers the next chunk's weights again. Breadth-first makes
        2v - 2 (its 2v - 1 runs: the chunks' forwards in order, then their backwards in
        reverse, the last chunk's forwards and backwards back to back); depth-first
        interleaving switches every few micro-batches, more as m grows."""
        row = self.ranks[rank]
        return sum(a.chunk != b.chunk for a, b in itertools.pairwise(row))

    @property
    def placement(self) -> str:
        """``"loop"`` or ``"v"`` when ``stage_to_rank`` is that named mapping, else ``"custom"``."""
        for name in ("loop", "v"):
            if self.stage_to_rank == stage_to_rank(self.stages, self.chunks, name):
                return name
        return "custom"

    @cached_property
    def _stages_held(self) -> tuple[tuple[int, ...], ...]:
        return tuple(
            tuple(j for j, owner in enumerate(self.stage_to_rank) if owner == r)
            for r in range(self.stages)
        )

    def virtual_stage(self, rank: int, chunk: int) -> int:
        """The virtual stage j that chunk ``chunk`` of ``rank`` runs (c p + r for the
        loop mapping, Narayanan et al. 2021, Section 2.2.2)."""
        return self._stages_held[rank][chunk]

    def rank_of(self, virtual_stage: int) -> int:
        """The rank that holds virtual stage j: ``stage_to_rank[j]``."""
        return self.stage_to_rank[virtual_stage]

    def chunk_of(self, virtual_stage: int) -> int:
        """Which of its rank's chunks virtual stage j is."""
        return self._stages_held[self.rank_of(virtual_stage)].index(virtual_stage)

    def __str__(self) -> str:
        return "\n".join(
            f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(self.ranks)
        )

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        chunks: int | None = None,
        name: str = "custom",
        micro_batches: int | None = None,
        stage_to_rank: Sequence[int] | None = None,
        bidirectional: bool = False,
    ) -> PipelineSchedule:
        """Read ``str(schedule)`` back: one line per rank, ``"rank 0: 0F0 0B0"`` or just
        ``"0F0 0B0"``. ``chunks`` defaults to one more than the largest chunk used;
        ``micro_batches``, ``stage_to_rank`` and ``bidirectional`` as in
        :class:`PipelineSchedule`."""
        rows = []
        for line in text.strip().splitlines():
            body = line.split(":", 1)[1] if ":" in line else line
            rows.append(tuple(Action.parse(word) for word in body.split()))
        v = chunks if chunks is not None else 1 + max((a.chunk for r in rows for a in r), default=0)
        mapping = None if stage_to_rank is None else tuple(stage_to_rank)
        return cls(
            tuple(rows),
            v,
            name,
            micro_batches=micro_batches,
            stage_to_rank=mapping,
            bidirectional=bidirectional,
        )


def check_size(stages: int, micro_batches: int, chunks: int = 1) -> tuple[int, int, int]:
    """``(p, m, v)``, each an int >= 1, or a ``ValueError`` when the schedule would be too
    big to build: more than :data:`MAX_STAGES` stages or more than :data:`MAX_SLOTS`
    slots p m v. The message names the value and the limit."""
    p, m = positive_int("stages", stages), positive_int("micro_batches", micro_batches)
    v = positive_int("chunks", chunks)
    if p > MAX_STAGES:
        raise ValueError(
            f"stages={p} is more than the {MAX_STAGES} stages distlab builds, replays and "
            "draws a pipeline schedule for; the closed forms of distlab.calc.pipeline "
            "(bubble_fraction, in_flight_micro_batches) take any size"
        )
    if p * m * v > MAX_SLOTS:
        raise ValueError(
            f"stages={p} x micro_batches={m} x chunks={v} = {p * m * v:,} slots is more than "
            f"the {MAX_SLOTS:,} slots distlab builds, replays and draws a pipeline schedule "
            "for; the closed forms of distlab.calc.pipeline (bubble_fraction, "
            "in_flight_micro_batches) take any size"
        )
    return p, m, v


def _check_mapping(mapping: tuple[int, ...], p: int, v: int) -> None:
    """p v entries, each a rank 0..p-1, every rank holding exactly v stages."""
    if len(mapping) != p * v or any(
        isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < p for r in mapping
    ):
        raise ValueError(
            f"stage_to_rank must give each of the {p * v} virtual stages a rank in 0..{p - 1} "
            f"(p={p}, chunks={v}); got {mapping!r}"
        )
    for r in range(p):
        if mapping.count(r) != v:
            raise ValueError(
                f"stage_to_rank gives rank {r} {mapping.count(r)} stages, but every rank "
                f"holds chunks={v}; got {mapping!r}"
            )


# -- generators -----------------------------------------------------------------


def gpipe(stages: int, micro_batches: int) -> PipelineSchedule:
    """GPipe (Huang et al. 2019, Figure 2c): every rank runs all m forwards, then all m
    backwards."""
    p, m, _ = check_size(stages, micro_batches)
    row = [Action(0, "F", i) for i in range(m)] + [Action(0, "B", i) for i in range(m)]
    return PipelineSchedule(tuple(tuple(row) for _ in range(p)), 1, "gpipe")


def one_f_one_b(stages: int, micro_batches: int) -> PipelineSchedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021, Section 2.2.1): rank r runs
    min(p - r - 1, m) warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards."""
    p, m, _ = check_size(stages, micro_batches)
    ranks = [
        _warmup_then_alternate(min(p - r - 1, m), m, lambda k, kind: Action(0, kind, k))
        for r in range(p)
    ]
    return PipelineSchedule(tuple(ranks), 1, "1f1b")


def interleaved(stages: int, micro_batches: int, chunks: int = 2) -> PipelineSchedule:
    """Interleaved 1F1B (Narayanan et al. 2021, Section 2.2.2) with v = ``chunks`` per rank.

    Micro-batches go through the chunks in groups of p: the k-th forward of a
    rank is micro-batch (k // (p v)) p + k % p through chunk (k % (p v)) // p;
    backwards visit the chunks in reverse. Rank r warms up with
    2(p - r - 1) + (v - 1) p forwards (all of them when m = p), as Megatron-LM
    does, and like Megatron-LM needs m to be a multiple of p.
    """
    p, m, v = check_size(stages, micro_batches, chunks)
    if m % p:
        raise ValueError(
            f"the interleaved schedule needs micro_batches to be a multiple of stages; "
            f"got micro_batches={m}, stages={p} (try micro_batches={p * -(-m // p)})"
        )

    def action(k: int, kind: str) -> Action:
        chunk = (k % (p * v)) // p
        return Action(v - 1 - chunk if kind == "B" else chunk, kind, (k // (p * v)) * p + k % p)

    total = m * v
    ranks = []
    for r in range(p):
        warmup = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
        ranks.append(_warmup_then_alternate(warmup, total, action))
    return PipelineSchedule(tuple(ranks), v, "interleaved")


def zb_h1(stages: int, micro_batches: int) -> PipelineSchedule:
    """ZB-H1 (Qi et al. 2024, Section 2.1): 1F1B with the backward split into
    I (input gradient, on the critical path) and W (weight gradient, free to wait).

    Rank r runs 1F1B's min(p - r - 1, m) warm-up forwards, then F, I pairs,
    holding back its first r weight passes: W of micro-batch k - r follows I
    of micro-batch k. The held-back W's fill the idle slots at the end, so
    the bubble shrinks from (p-1)(T_F + T_B) to (p-1)(T_F + T_I - T_W) while
    the first rank still holds at most p micro-batches' activations.
    """
    p, m, _ = check_size(stages, micro_batches)
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [Action(0, "F", i) for i in range(warmup)]
        next_w = 0
        for k in range(m):
            if warmup + k < m:
                row.append(Action(0, "F", warmup + k))
            row.append(Action(0, "I", k))
            if k >= r or warmup + k >= m:  # held back r W's, but not past the cool-down
                row.append(Action(0, "W", next_w))
                next_w += 1
        row += [Action(0, "W", i) for i in range(next_w, m)]
        ranks.append(tuple(row))
    return PipelineSchedule(tuple(ranks), 1, "zb_h1")


def zb_h2(stages: int, micro_batches: int) -> PipelineSchedule:
    """ZB-H2 (Qi et al. 2024, Section 2.2): ZB-H1 with more warm-up forwards, so that
    no rank waits for its first input gradient.

    Rank r runs min(2(p - r) - 1, m) warm-up forwards: the first input
    gradient reaches it 2(p - r) - 1 slots after its first forward when
    T_F = T_I = T_W. Then, for each micro-batch k in order, the input
    gradient I of k, followed by the next forward while forwards remain and
    by the oldest pending weight pass W once they do; the W's left over
    close the step. Each rank is busy from its first action to its last (a
    parallelogram, not 1F1B's trapezoid): the paper's bubble
    (p-1)(T_F + T_I - 2 T_W) is zero at equal costs once consecutive steps
    overlap (its optimizer post-validation, Section 4); within one
    synchronous step rank r still waits r slots to start and finishes
    p - 1 - r slots before the last rank. The price: the first rank holds
    2p - 1 micro-batches' activations, not p.
    """
    p, m, _ = check_size(stages, micro_batches)
    ranks = []
    for r in range(p):
        warmup = min(2 * (p - r) - 1, m)
        row = [Action(0, "F", i) for i in range(warmup)]
        next_w = 0
        for k in range(m):
            row.append(Action(0, "I", k))
            if warmup + k < m:
                row.append(Action(0, "F", warmup + k))
            else:
                row.append(Action(0, "W", next_w))
                next_w += 1
        row += [Action(0, "W", i) for i in range(next_w, m)]
        ranks.append(tuple(row))
    return PipelineSchedule(tuple(ranks), 1, "zb_h2")


def zb_v(stages: int, micro_batches: int) -> PipelineSchedule:
    """ZB-V (Qi et al. 2024, Section 6): two chunks per rank in a V, the backward
    split into I and W, zero bubble at 1F1B's activation memory when T_F = T_I = T_W.

    Rank r holds virtual stages r (chunk 0, on the way down) and 2p - 1 - r
    (chunk 1, on the way back up), so rank 0 runs both the first and the
    last stage and rank p - 1 turns the V with no message. Rank r's order:

    1. 2(p - r) - 1 forwards of chunk 0 (the way down fills);
    2. r pairs: a forward of chunk 1, a forward of chunk 0;
    3. p - r triples on chunk 1: forward, I, W (the first gradients start up);
    4. steady, while forwards remain: chunk 0 forward, I, W, then chunk 1
       forward, I, W;
    5. cool-down: r pairs of I's (chunk 0, then chunk 1), then the chunk 0
       I's left each followed by one of its W's, then every W left.

    Rank 0 holds at most 2p chunk activations of L/(2p) layers each: p
    micro-batches' worth of its layers, as 1F1B.

    Any m >= 1: the first rank's warm-up alone runs 2p - 1 forwards, so with fewer
    micro-batches the order is built for 2p - 1 and the actions of the ones that do not
    exist are dropped (what torch's ``ScheduleZBVZeroBubble`` does; the order equals its
    for every m). Dropping them keeps the order runnable: a real micro-batch never waits
    on a missing one. The ranks then idle where the missing work would have run, so the
    bubble closed forms of :mod:`distlab.calc.pipeline` need m >= 2p - 1 (replay the
    schedule for fewer).
    """
    p, m, _ = check_size(stages, micro_batches)
    built = max(m, 2 * p - 1)
    ranks = tuple(tuple(a for a in _zb_v_rank(p, built, r) if a.micro_batch < m) for r in range(p))
    return PipelineSchedule(
        ranks, 2, "zb_v", micro_batches=m, stage_to_rank=stage_to_rank(p, 2, "v")
    )


def check_v_shape(name: str, stages: int, micro_batches: int) -> None:
    """``ValueError`` unless the V-shaped schedule ``name`` with these sizes has the shape
    its closed forms assume (ZB-V: m >= 2p - 1, the first rank's warm-up; DualPipeV:
    m >= 2p, which is also the least it can be built with, as in torch's
    ``ScheduleDualPipeV``; DualPipe: an even p and an even m >= 2p), without building it:
    the closed forms of :mod:`distlab.calc.pipeline` ask it for any size. ZB-V itself
    builds with any m (:func:`zb_v`)."""
    p, m = positive_int("stages", stages), positive_int("micro_batches", micro_batches)
    if name == "dualpipe":
        if p % 2 or m % 2 or m < 2 * p:
            raise ValueError(
                f"DualPipe needs an even number of stages and an even micro_batches >= "
                f"2 * stages; got stages={p}, micro_batches={m}"
            )
        return
    label, least, reads = {
        "zb_v": ("ZB-V", 2 * p - 1, "2 * stages - 1"),
        "dualpipe_v": ("DualPipeV", 2 * p, "2 * stages"),
    }[name]
    if m < least:
        fewer = (
            " for its closed forms (zb_v itself builds with fewer: replay it for their bubble)"
            if name == "zb_v"
            else ""
        )
        raise ValueError(
            f"{label} needs micro_batches >= {reads} = {least}{fewer}; got "
            f"micro_batches={m}, stages={p}"
        )


def _v_schedule(name: str, p: int, m: int, rank_actions) -> PipelineSchedule:
    """The V-shaped schedule ``name`` whose rank r runs ``rank_actions(p, m, r)``."""
    check_v_shape(name, p, m)
    ranks = tuple(rank_actions(p, m, r) for r in range(p))
    return PipelineSchedule(ranks, 2, name, micro_batches=m, stage_to_rank=stage_to_rank(p, 2, "v"))


def _zb_v_rank(p: int, m: int, r: int) -> tuple[Action, ...]:
    """Rank r's actions of :func:`zb_v`; counters per chunk keep micro-batches in order."""
    row: list[Action] = []
    nxt = {(c, kind): 0 for c in (0, 1) for kind in ("F", "I", "W")}

    def do(chunk: int, *kinds: str) -> None:
        for kind in kinds:
            row.append(Action(chunk, kind, nxt[(chunk, kind)]))
            nxt[(chunk, kind)] += 1

    for _ in range(2 * (p - r) - 1):
        do(0, "F")
    for _ in range(r):
        do(1, "F")
        do(0, "F")
    for _ in range(p - r):
        do(1, "F", "I", "W")
    while nxt[(0, "F")] < m or nxt[(1, "F")] < m:
        if nxt[(0, "F")] < m:
            do(0, "F")
        do(0, "I", "W")
        do(1, "F", "I", "W")
    for _ in range(r):
        do(0, "I")
        do(1, "I")
    while nxt[(0, "I")] < m:
        do(0, "I", "W")
    while nxt[(1, "W")] < m:
        do(1, "W")
    while nxt[(0, "W")] < m:
        do(0, "W")
    return tuple(row)


def dualpipe_v(stages: int, micro_batches: int) -> PipelineSchedule:
    """DualPipeV: DualPipe (DeepSeek-V3 report, Section 3.2.1) cut in half and folded
    into a V, so each rank keeps one copy of the weights. DeepSeek's DualPipe repository
    (its README) credits this "cut-in-half" variant to a Sea AI Lab blog post; it is not
    in the V3 report.

    Same stage mapping as :func:`zb_v` (rank r: stages r and 2p - 1 - r).
    Rank r's order, in eight phases, the numbered "steps" of DeepSeek's code
    (``dualpipe/dualpipev.py``, where ``phase`` means a direction); B is a whole
    backward; an I whose W is "held" pushes that W onto a queue, and each W takes
    the oldest:

    1. 2(p - r - 1) forwards of chunk 0;
    2. r + 1 pairs: forward chunk 0, forward chunk 1;
    3. p - r - 1 triples on chunk 1: I (W held), W, forward;
    4. m - 2p + r + 1 quadruples: forward chunk 0, B chunk 1, forward chunk 1,
       B chunk 0: the steady state, where DeepSeek overlaps each forward with
       the other direction's backward (here they run one after the other);
    5. p - r - 1 triples: B chunk 1, forward chunk 1, B chunk 0;
    6. r + 1 pairs: backward chunk 1, backward chunk 0; from the middle pair
       on, the backwards are I's with their W held;
    7. p - r - 1 pairs: a held W, then I of chunk 0 (W held);
    8. the r + 1 held W's left.

    Needs m >= 2p. Activations: rank 0 holds at most 2p + 1 chunks, that is
    p + 1/2 micro-batches of its layers (the report's PP + 1 chunks of half size).
    """
    p, m, _ = check_size(stages, micro_batches)
    return _v_schedule("dualpipe_v", p, m, _dualpipe_v_rank)


def _dualpipe_v_rank(p: int, m: int, r: int) -> tuple[Action, ...]:
    """Rank r's actions of :func:`dualpipe_v`."""
    row: list[Action] = []
    nxt = {(c, kind): 0 for c in (0, 1) for kind in ("F", "B")}
    held: list[Action] = []  # W's owed, oldest first

    def forward(chunk: int) -> None:
        row.append(Action(chunk, "F", nxt[(chunk, "F")]))
        nxt[(chunk, "F")] += 1

    def backward(chunk: int, hold_w: bool = False) -> None:
        i = nxt[(chunk, "B")]
        nxt[(chunk, "B")] += 1
        if hold_w:
            row.append(Action(chunk, "I", i))
            held.append(Action(chunk, "W", i))
        else:
            row.append(Action(chunk, "B", i))

    def weight() -> None:
        row.append(held.pop(0))

    for _ in range(2 * (p - r - 1)):
        forward(0)
    for _ in range(r + 1):
        forward(0)
        forward(1)
    for _ in range(p - r - 1):
        backward(1, hold_w=True)
        weight()
        forward(1)
    for _ in range(m - 2 * p + r + 1):
        forward(0)
        backward(1)
        forward(1)
        backward(0)
    for _ in range(p - r - 1):
        backward(1)
        forward(1)
        backward(0)
    pairs, hold = r + 1, False
    for i in range(pairs):
        hold = hold or (i == pairs // 2 and r % 2 == 1)
        backward(1, hold)
        hold = hold or (i == pairs // 2 and r % 2 == 0)
        backward(0, hold)
    for _ in range(p - r - 1):
        weight()
        backward(0, hold_w=True)
    while held:
        weight()
    return tuple(row)


def dualpipe(stages: int, micro_batches: int) -> PipelineSchedule:
    """DualPipe (DeepSeek-AI 2024, DeepSeek-V3 report Section 3.2.1, Figure 5): two
    pipelines in opposite directions on the same p ranks, each a copy of the model.

    Micro-batches 0..m/2-1 enter at rank 0 and go down (virtual stages 0..p-1,
    stage k on rank k), micro-batches m/2..m-1 enter at rank p-1 and go up
    (stages p..2p-1, stage p + k on rank p - 1 - k); stage j runs model part
    j mod p, so rank r holds parts r and p - 1 - r and, with its mirror rank
    p - 1 - r, adds up both copies' gradients after the step. Chunk 0 of rank r
    is its down stage, chunk 1 its up stage (the V mapping with
    ``bidirectional=True``).

    Rank r's order has :func:`dualpipe_v`'s eight phases with h = min(r, p-1-r)
    in place of r and p/2 in place of p, where "chunk 0" is the direction the
    rank meets first: down for the first half of the ranks, up for the second.
    Needs an even p and an even m >= 2p. Twice the parameters per rank; rank 0
    holds p + 1 micro-batches' activations at its peak (the report's PP + 1).
    """
    p, m, _ = check_size(stages, micro_batches)
    check_v_shape("dualpipe", p, m)
    ranks = []
    for r in range(p):
        near = 0 if r < p // 2 else 1  # the chunk whose pipeline this rank meets first
        half = _dualpipe_v_rank(p // 2, m // 2, min(r, p - 1 - r))
        ranks.append(
            tuple(
                Action(a.chunk ^ near, a.kind, a.micro_batch + (m // 2 if a.chunk ^ near else 0))
                for a in half
            )
        )
    return PipelineSchedule(
        tuple(ranks),
        2,
        "dualpipe",
        micro_batches=m,
        stage_to_rank=stage_to_rank(p, 2, "v"),
        bidirectional=True,
    )


def breadth_first(stages: int, micro_batches: int, chunks: int = 2) -> PipelineSchedule:
    """Breadth-first looping (Lamy-Poirier 2023, "Breadth-First Pipeline
    Parallelism"; torch's ``ScheduleLoopedBFS``): v = ``chunks`` per rank, loop
    placement as :func:`interleaved`, but every micro-batch goes through a chunk
    before any goes on to the next: all m forwards of chunk 0, then of chunk
    1, ..., then the backwards, last chunk first.

    Same bubble as the depth-first interleaved schedule, (p-1)/(v m + p - 1) of
    the step (m >= p), but GPipe's memory: all m micro-batches in flight. What
    it buys: each chunk's weights are used for m micro-batches in a row, so a
    sharded data-parallel run (ZeRO-3/FSDP) gathers them once per step and
    direction instead of once per group of p micro-batches.
    """
    p, m, v = check_size(stages, micro_batches, chunks)
    row = [Action(c, "F", i) for c in range(v) for i in range(m)]
    row += [Action(c, "B", i) for c in reversed(range(v)) for i in range(m)]
    return PipelineSchedule(tuple(tuple(row) for _ in range(p)), v, "breadth_first")


def _warmup_then_alternate(warmup: int, total: int, make: Callable) -> tuple[Action, ...]:
    """``warmup`` forwards, then (forward, backward) pairs, then the remaining backwards."""
    row = [make(k, "F") for k in range(warmup)]
    for k in range(total - warmup):
        row += [make(warmup + k, "F"), make(k, "B")]
    row += [make(k, "B") for k in range(total - warmup, total)]
    return tuple(row)


GENERATORS = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb_h1": zb_h1,
    "zb_h2": zb_h2,
    "zb_v": zb_v,
    "dualpipe_v": dualpipe_v,
    "dualpipe": dualpipe,
    "breadth_first": breadth_first,
}
LOOPING = ("interleaved", "breadth_first")
"""Schedules that take ``chunks`` (v model chunks per rank, loop placement)."""
V_SHAPED = ("zb_v", "dualpipe_v", "dualpipe")
"""Schedules with two chunks per rank in a V (:func:`stage_to_rank` ``"v"``; DualPipe's V
is two pipelines, one each way)."""
BIDIRECTIONAL = ("dualpipe",)
"""Schedules that run two copies of the model, one per direction
(``PipelineSchedule.bidirectional``)."""


def chunks_of(name: str, chunks: int = 1) -> int:
    """How many model chunks each rank holds in schedule ``name`` built with
    ``chunks``: ``chunks`` itself for a looping schedule, always 2 for a V-shaped
    one (``chunks`` 1, the default, or 2), else 1. ``ValueError`` names a
    ``chunks`` the schedule cannot take."""
    if name not in GENERATORS:
        raise ValueError(f"unknown schedule {name!r}; allowed: {', '.join(map(repr, GENERATORS))}")
    chunks = positive_int("chunks", chunks)
    if name in LOOPING:
        return chunks
    if name in V_SHAPED and chunks in (1, 2):
        return 2
    if chunks != 1:
        raise ValueError(
            f"chunks={chunks} needs schedule 'interleaved' or 'breadth_first' (got {name!r}); "
            f"the V-shaped {', '.join(V_SHAPED)} always have 2 chunks, the others 1"
        )
    return 1


def build(name: str, stages: int, micro_batches: int, *, chunks: int = 1) -> PipelineSchedule:
    """``build("interleaved", 4, 8, chunks=2)``: the schedule called ``name`` (see
    GENERATORS), with :func:`chunks_of` ``(name, chunks)`` chunks per rank."""
    v = chunks_of(name, chunks)
    if name in LOOPING:
        return GENERATORS[name](stages, micro_batches, v)
    return GENERATORS[name](stages, micro_batches)


def with_communication(schedule: PipelineSchedule) -> PipelineSchedule:
    """The same schedule with its sends and receives spelled out: ``RF`` before each
    forward that needs a previous stage's output, ``SF`` after each forward whose
    output a next stage needs, ``RB``/``SB`` likewise around each ``B`` or ``I``."""
    if any(a.kind in COMM_KINDS for r in schedule.ranks for a in r):
        return schedule
    rows = []
    for r, acts in enumerate(schedule.ranks):
        row: list[Action] = []
        for a in acts:
            j = schedule.virtual_stage(r, a.chunk)
            first, last = schedule.route(a.micro_batch)
            if a.kind == "F":
                row += [Action(a.chunk, "RF", a.micro_batch)] if j > first else []
                row += [a] + ([Action(a.chunk, "SF", a.micro_batch)] if j < last else [])
            elif a.kind in ("B", "I"):
                row += [Action(a.chunk, "RB", a.micro_batch)] if j < last else []
                row += [a] + ([Action(a.chunk, "SB", a.micro_batch)] if j > first else [])
            else:
                row.append(a)
        rows.append(tuple(row))
    return PipelineSchedule(
        tuple(rows),
        schedule.chunks,
        schedule.name,
        micro_batches=schedule.micro_batches,
        stage_to_rank=schedule.stage_to_rank,
        bidirectional=schedule.bidirectional,
    )


# the old name, which notebooks from older releases still import from here
__getattr__ = old_names(__name__, {"Schedule": PipelineSchedule})
