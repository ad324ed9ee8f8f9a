"""Pipeline bubbles: the closed forms, and the schedules they come from.

With p stages and m micro-batches, GPipe (Huang et al. 2019) and 1F1B
(PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", Section 2.2.1) leave each
stage idle for (p-1) forward+backward slots per step, while the ideal step
is m slots:

* bubble / ideal time   = (p - 1) / m
* bubble / total time   = (p - 1) / (m + p - 1)

The interleaved schedule (Section 2.2.2) gives each rank v model chunks
("virtual stages"); a slot is v times shorter, so the bubble shrinks by v:
(p - 1) / (v m) of the ideal time, at v times more point-to-point traffic.

The schedules themselves are data: :func:`schedule_ops` lists each rank's
forward (F) and backward (B) ops, :func:`replay` times them with
dependencies, and the bubble counted from the timeline equals the formula
(the tests check it). GPipe keeps all m micro-batches' activations; 1F1B
keeps at most p on the first stage (:func:`in_flight_micro_batches`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validate import choice, positive, positive_int

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RELATIVE_TO = ("total", "ideal")


def _check(stages: int, micro_batches: int, schedule: str, virtual_stages: int) -> tuple:
    p = positive_int("stages", stages)
    m = positive_int("micro_batches", micro_batches)
    choice("schedule", schedule, SCHEDULES)
    v = positive_int("virtual_stages", virtual_stages)
    if schedule != "interleaved" and v != 1:
        raise ValueError(
            f"virtual_stages={v} needs schedule='interleaved' (got {schedule!r}); "
            "gpipe and 1f1b have one model chunk per rank"
        )
    return p, m, v


def bubble_fraction(
    stages: int,
    micro_batches: int,
    *,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    relative_to: str = "total",
) -> float:
    """Idle share of a pipeline step (Narayanan et al. 2021, Section 2.2).

    ``relative_to="total"``: (p-1) / (v m + p - 1), the idle fraction of the
    step's wall time; ``relative_to="ideal"``: (p-1) / (v m), the bubble time
    divided by the ideal (bubble-free) compute time, the paper's form. v = 1
    for ``"gpipe"`` and ``"1f1b"`` (same bubble; 1F1B needs less memory).
    """
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    choice("relative_to", relative_to, RELATIVE_TO)
    if relative_to == "ideal":
        return (p - 1) / (v * m)
    return (p - 1) / (v * m + p - 1)


def in_flight_micro_batches(
    stages: int, micro_batches: int, *, schedule: str = "1f1b", virtual_stages: int = 1
) -> float:
    """Micro-batches whose activations the first stage holds at its peak.

    Counted in micro-batches' worth of that rank's layers (L/p):

    * GPipe: m (every forward runs before any backward);
    * 1F1B: min(p, m) (the first stage runs p - 1 warm-up forwards, then one more
      before its first backward);
    * interleaved: min(m, p + (p-1)/v). Megatron-LM's first rank runs
      2(p-1) + (v-1)p warm-up forwards of chunks holding L/(pv) layers, one
      more before its first backward: (vp + p - 1) chunks, i.e. the factor
      1 + (p-1)/(pv) of Korthikanti et al. 2022, Section 4.2.3.
    """
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p, m)
    return min(m * v, v * p + p - 1) / v


# -- schedules as data ----------------------------------------------------------


@dataclass(frozen=True)
class PipeOp:
    """One op of a pipeline schedule: forward ``"F"`` or backward ``"B"`` of a
    micro-batch through one of the rank's model chunks (chunk 0 unless interleaved)."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.micro_batch}" + (f".{self.chunk}" if self.chunk else "")


def schedule_ops(
    stages: int, micro_batches: int, *, schedule: str = "1f1b", virtual_stages: int = 1
) -> list[list[PipeOp]]:
    """Each rank's ops in execution order: ``ops[rank] = [PipeOp, ...]``.

    * ``"gpipe"``: all forwards, then all backwards (in micro-batch order);
    * ``"1f1b"``: rank r runs min(p - r - 1, m) warm-up forwards, then
      alternates one forward and one backward, then drains the backwards;
    * ``"interleaved"``: Megatron-LM's schedule with v chunks per rank (chunk c
      of rank r is virtual stage c p + r). Micro-batches go through the chunks
      in groups of p; rank r warms up with 2(p - r - 1) + (v - 1) p forwards
      (all of them when m = p). Needs m to be a multiple of p, as Megatron-LM does.
    """
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    if schedule == "gpipe":
        return [[PipeOp("F", i) for i in range(m)] + [PipeOp("B", i) for i in range(m)]] * p
    if schedule == "1f1b":
        return [
            _one_f_one_b(min(p - r - 1, m), m, lambda k, kind: PipeOp(kind, k)) for r in range(p)
        ]
    if m % p:
        raise ValueError(
            f"the interleaved schedule needs micro_batches to be a multiple of stages; "
            f"got micro_batches={m}, stages={p}"
        )

    def op(k: int, kind: str) -> PipeOp:
        chunk = (k % (p * v)) // p
        if kind == "B":
            chunk = v - 1 - chunk
        return PipeOp(kind, (k // (p * v)) * p + k % p, chunk)

    total = m * v
    ops = []
    for r in range(p):
        warmup = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
        ops.append(_one_f_one_b(warmup, total, op))
    return ops


def _one_f_one_b(warmup: int, total: int, make) -> list[PipeOp]:
    """``warmup`` forwards, then (forward, backward) pairs, then the remaining backwards."""
    ops = [make(k, "F") for k in range(warmup)]
    for k in range(total - warmup):
        ops += [make(warmup + k, "F"), make(k, "B")]
    ops += [make(k, "B") for k in range(total - warmup, total)]
    return ops


@dataclass(frozen=True)
class TimedOp:
    rank: int
    op: PipeOp
    start: float
    end: float


@dataclass(frozen=True)
class PipelineTimeline:
    """A replayed schedule: every op's start and end, the step time, idle time."""

    stages: int
    ops: tuple[TimedOp, ...]
    makespan: float
    busy: tuple[float, ...]

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over ranks (compare ``relative_to="total"``)."""
        return sum(self.idle) / (self.stages * self.makespan)


def replay(
    ops: list[list[PipeOp]], *, forward_time: float = 1.0, backward_time: float = 2.0
) -> PipelineTimeline:
    """Time a schedule: each rank runs its ops in order, an op starts when the
    rank is free and its input is ready.

    ``forward_time`` and ``backward_time`` are per micro-batch through one
    whole stage (a chunk takes 1/v of that); the default backward costs twice
    the forward (two matmuls per forward one). F of virtual stage j waits for
    F of stage j-1; B of stage j waits for B of stage j+1 (the last stage's B
    for its own F). Communication is free here; :mod:`distlab.sim` models it.
    """
    t_f, t_b = positive("forward_time", forward_time), positive("backward_time", backward_time)
    p = len(ops)
    if p == 0:
        raise ValueError("ops must list at least one rank's ops")
    v = 1 + max((op.chunk for rank_ops in ops for op in rank_ops), default=0)
    last = p * v - 1
    finish: dict[tuple[str, int, int], float] = {}
    pos, free = [0] * p, [0.0] * p
    timed: list[TimedOp] = []
    remaining = sum(len(r) for r in ops)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(ops[r]):
                op = ops[r][pos[r]]
                j = op.chunk * p + r
                if op.kind == "F":
                    dep = ("F", j - 1, op.micro_batch) if j > 0 else None
                else:
                    dep = ("B", j + 1, op.micro_batch) if j < last else ("F", j, op.micro_batch)
                if dep is not None and dep not in finish:
                    break
                start = max(free[r], finish[dep] if dep else 0.0)
                end = start + (t_f if op.kind == "F" else t_b) / v
                finish[(op.kind, j, op.micro_batch)] = end
                free[r] = end
                timed.append(TimedOp(r, op, start, end))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(ops[r][pos[r]]) for r in range(p) if pos[r] < len(ops[r])}
            raise ValueError(f"schedule deadlocks: ranks wait on each other at {stuck}")
    busy = tuple(sum(t.end - t.start for t in timed if t.rank == r) for r in range(p))
    return PipelineTimeline(p, tuple(timed), max(free), busy)


def max_in_flight(rank_ops: list[PipeOp], virtual_stages: int = 1) -> float:
    """The most micro-batches' activations one rank holds, counted from its op order
    (a forward stores one chunk's worth, 1/v of the rank's layers; its backward frees it)."""
    held, peak = 0, 0
    for op in rank_ops:
        held += 1 if op.kind == "F" else -1
        peak = max(peak, held)
    return peak / positive_int("virtual_stages", virtual_stages)
