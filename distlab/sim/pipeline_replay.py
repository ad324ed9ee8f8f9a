"""Check and time a pipeline schedule: one walk over every rank's actions.

Each rank runs its actions (:mod:`distlab.core.pipeline_schedule`) in order;
an action starts when the rank is free and what it needs has arrived:

* F of virtual stage j needs F of j - 1 (the activation);
* B, or I, of j needs its own F and B/I of j + 1 (the output's gradient);
* W of j needs its own I;
* with sends and receives spelled out, a receive needs the peer's send and
  the compute action needs the receive; sends never wait (``isend``).
  Neighbouring stages on the same rank (the turn of a V-shaped schedule)
  hand over directly, as in torch, whether or not a send is written.

Virtual stages come from the schedule's ``stage_to_rank`` mapping, so
loop-around and V-shaped schedules are checked and timed alike.

If no rank can move and some have actions left, the schedule deadlocks, and
the error names each waiting rank, its action and what it waits for. The
same walk gives the timeline (with per-action costs and message costs), the
idle time, and each rank's peak number of activations in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from distlab.core.checks import fraction
from distlab.core.pipeline_schedule import COMM_KINDS, COMPUTE_KINDS, Action, PipelineSchedule


class ScheduleError(ValueError):
    """A schedule that cannot run: names the rank and the action."""


@dataclass(frozen=True)
class TimedAction:
    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A replayed schedule: every compute action's start and end, and the idle time."""

    schedule: PipelineSchedule
    entries: tuple[TimedAction, ...]
    makespan: float
    busy: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    peak_pending_weight_grads: tuple[int, ...]

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over ranks (``relative_to="total"``)."""
        return sum(self.idle) / (len(self.busy) * self.makespan)

    @property
    def spans(self) -> tuple[tuple[float, float], ...]:
        """Each rank's (first start, last end)."""
        out = []
        for r in range(len(self.busy)):
            mine = [e for e in self.entries if e.rank == r]
            out.append((min(e.start for e in mine), max(e.end for e in mine)) if mine else (0, 0))
        return tuple(out)

    @property
    def span_bubble_fraction(self) -> float:
        """Idle share inside each rank's own span (first start to last end), summed
        over ranks: the bubble left when each rank starts its next step as soon as
        it is done, as with Qi et al.'s optimizer post-validation (2024, Section 4).
        0 for a schedule whose ranks never wait once started (ZB-H2, ZB-V)."""
        spans = [end - start for start, end in self.spans]
        return (sum(spans) - sum(self.busy)) / sum(spans)

    @property
    def bubble_over_ideal(self) -> float:
        """Idle time over compute time (``relative_to="ideal"``)."""
        return sum(self.idle) / sum(self.busy)


def _cost(value: float | Sequence[float], j: int, share: float, name: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value * share
    return float(value[j])


def _check_costs(value: float | Sequence[float], stages: int, name: str) -> None:
    """A cost is seconds >= 0: one number per whole stage, or one per virtual stage."""
    values = [value] if isinstance(value, (int, float)) else list(value)
    if isinstance(value, bool) or (not isinstance(value, (int, float)) and len(values) != stages):
        raise ValueError(
            f"{name} must be a number or {stages} numbers (one per virtual stage), got {value!r}"
        )
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0 for x in values):
        raise ValueError(f"{name} must be seconds >= 0, got {value!r}")


def replay(
    schedule: PipelineSchedule,
    *,
    forward_time: float | Sequence[float] = 1.0,
    backward_time: float | Sequence[float] = 2.0,
    weight_fraction: float = 0.5,
    p2p_time: Callable[[int, int], float] | None = None,
) -> Timeline:
    """Time a schedule: each rank runs its actions in order; an action starts when
    the rank is free and what it needs has arrived. Raises :class:`ScheduleError`
    (naming the rank and action) if the schedule is incomplete or deadlocks.

    Costs: ``forward_time``/``backward_time`` per micro-batch through one rank's
    whole stage (a chunk takes :attr:`~PipelineSchedule.chunk_share` of it: 1/v, or a whole
    stage for each of DualPipe's two copies), or a sequence with one entry per
    virtual stage, in seconds. A split backward costs ``(1 - weight_fraction)``
    of ``backward_time`` for ``I`` and ``weight_fraction`` for ``W``.
    ``p2p_time(src, dst)``: seconds for one activation or gradient message
    between two ranks (free when None; :mod:`distlab.sim.pipeline` supplies
    alpha-beta costs). Sends are non-blocking, receives wait.

    Dependencies: F of virtual stage j needs F of j - 1; B (or I) of j needs
    its own F and B/I of j + 1; W needs its own I.
    """
    fraction("weight_fraction", weight_fraction)
    _check_complete(schedule)
    p, v = schedule.stages, schedule.chunks
    _check_costs(forward_time, p * v, "forward_time")
    _check_costs(backward_time, p * v, "backward_time")
    explicit = any(a.kind in COMM_KINDS for r in schedule.ranks for a in r)
    send = p2p_time or (lambda src, dst: 0.0)
    done: dict[tuple, float] = {}  # token -> time it is available
    pos, free = [0] * p, [0.0] * p
    entries: list[TimedAction] = []
    held, pending = [0] * p, [0] * p
    peak_held, peak_pending = [0] * p, [0] * p
    while True:
        progressed = False
        for r in range(p):
            while pos[r] < len(schedule.ranks[r]):
                a = schedule.ranks[r][pos[r]]
                j = schedule.virtual_stage(r, a.chunk)
                needs = _needs(a, j, explicit, schedule)
                if any(token not in done for token, _ in needs):
                    break
                # a message from another rank arrives p2p_time after it was made
                arrivals = [
                    done[token] + (0.0 if src == r else send(src, r))
                    for token, src in ((t, schedule.rank_of(maker)) for t, maker in needs)
                ]
                ready = max([free[r], *arrivals])
                cost = _action_cost(
                    a, j, schedule.chunk_share, forward_time, backward_time, weight_fraction
                )
                done[(_produces(a.kind), j, a.micro_batch)] = ready + cost
                free[r] = ready + cost
                if a.kind in COMPUTE_KINDS:
                    entries.append(TimedAction(r, a, ready, ready + cost))
                held[r] += {"F": 1, "B": -1, "I": -1}.get(a.kind, 0)
                pending[r] += {"I": 1, "W": -1}.get(a.kind, 0)
                peak_held[r] = max(peak_held[r], held[r])
                peak_pending[r] = max(peak_pending[r], pending[r])
                pos[r] += 1
                progressed = True
        if all(pos[r] == len(schedule.ranks[r]) for r in range(p)):
            break
        if not progressed:
            raise ScheduleError(_deadlock_message(schedule, pos, done, explicit))
    busy = tuple(sum(e.end - e.start for e in entries if e.rank == r) for r in range(p))
    return Timeline(
        schedule, tuple(entries), max(free), busy, tuple(peak_held), tuple(peak_pending)
    )


def check(schedule: PipelineSchedule) -> Timeline:
    """Prove ``schedule`` complete and deadlock-free (raise :class:`ScheduleError`
    naming the rank and action otherwise); the result's ``peak_in_flight[r]``
    is the most chunk activations rank r holds (F to its B or I).

    With sends and receives spelled out, every receive must find its send and
    every forward or backward that needs a message must find its receive; a
    send nobody receives leaves its receiver's action waiting, which is
    reported as a deadlock naming it."""
    return replay(schedule)


def _produces(kind: str) -> str:
    """The token an action of this kind makes (a send or receive makes its own kind)."""
    return {"F": "act", "B": "grad", "I": "grad", "W": "wgrad"}.get(kind, kind)


def _needs(
    a: Action, j: int, explicit: bool, schedule: PipelineSchedule
) -> list[tuple[tuple, int]]:
    """(token, virtual stage that makes it) pairs the action waits for; a message is
    only needed from a neighbouring stage on another rank. The micro-batch's route
    (:meth:`PipelineSchedule.route`) says where its pipeline starts and ends."""
    i = a.micro_batch
    first, last = schedule.route(i)

    def by_message(k: int) -> bool:
        return explicit and schedule.rank_of(k) != schedule.rank_of(j)

    if a.kind == "F":
        if j == first:
            return []
        return [(("RF", j, i), j)] if by_message(j - 1) else [(("act", j - 1, i), j - 1)]
    if a.kind in ("B", "I"):
        own = [(("act", j, i), j)]
        if j == last:
            return own
        return own + ([(("RB", j, i), j)] if by_message(j + 1) else [(("grad", j + 1, i), j + 1)])
    if a.kind == "W":
        return [(("grad", j, i), j)]
    if a.kind == "SF":
        return [(("act", j, i), j)]
    if a.kind == "SB":
        return [(("grad", j, i), j)]
    if a.kind == "RF":
        return [(("SF", j - 1, i), j - 1)]
    return [(("SB", j + 1, i), j + 1)]  # RB


def _action_cost(a, j, share, forward_time, backward_time, weight_fraction) -> float:
    if a.kind == "F":
        return _cost(forward_time, j, share, "forward_time")
    if a.kind in ("B", "I", "W"):
        full = _cost(backward_time, j, share, "backward_time")
        return {"B": full, "I": full * (1 - weight_fraction), "W": full * weight_fraction}[a.kind]
    return 0.0


def _check_complete(schedule: PipelineSchedule) -> None:
    """Every rank runs F and (B, or I then W) exactly once per chunk and micro-batch."""
    m, v = schedule.micro_batches, schedule.chunks
    for r, acts in enumerate(schedule.ranks):
        seen: dict[Action, int] = {}
        for position, a in enumerate(acts):
            if a.chunk >= v:
                raise ScheduleError(f"rank {r}: action {a} uses chunk {a.chunk}, but chunks={v}")
            if a.micro_batch >= m:
                raise ScheduleError(
                    f"rank {r}: action {a} (position {position}) uses micro-batch "
                    f"{a.micro_batch}, but m={m} (micro-batches 0..{m - 1})"
                )
            j = schedule.virtual_stage(r, a.chunk)
            first, last = schedule.route(a.micro_batch)
            if not first <= j <= last:
                raise ScheduleError(
                    f"rank {r}: action {a} runs stage {j}, but micro-batch {a.micro_batch} "
                    f"goes through stages {first}..{last} only"
                )
            if (a.kind in ("RF", "SB") and j == first) or (a.kind in ("SF", "RB") and j == last):
                end = "first" if j == first else "last"
                raise ScheduleError(f"rank {r}: action {a} talks past the {end} stage")
            if a in seen:
                raise ScheduleError(
                    f"rank {r}: action {a} appears twice (positions {seen[a]} and {position})"
                )
            seen[a] = position
        for c in range(v):
            j = schedule.virtual_stage(r, c)
            for i in range(m):
                if not schedule.route(i)[0] <= j <= schedule.route(i)[1]:
                    continue
                whole, split = Action(c, "B", i) in seen, Action(c, "I", i) in seen
                missing = [Action(c, "F", i)] if Action(c, "F", i) not in seen else []
                if whole and split:
                    raise ScheduleError(
                        f"rank {r}: both {Action(c, 'B', i)} and "
                        f"{Action(c, 'I', i)}; use B, or I and W"
                    )
                if not whole and not split:
                    missing.append(
                        f"{Action(c, 'B', i)} (or {Action(c, 'I', i)} and {Action(c, 'W', i)})"
                    )
                elif split and Action(c, "W", i) not in seen:
                    missing.append(Action(c, "W", i))
                elif whole and Action(c, "W", i) in seen:
                    raise ScheduleError(
                        f"rank {r}: {Action(c, 'W', i)} after a whole backward "
                        f"{Action(c, 'B', i)}; use I and W, or B alone"
                    )
                if missing:
                    names = ", ".join(map(str, missing))
                    raise ScheduleError(f"rank {r} is missing {names} (m={m}, chunks={v})")


def _deadlock_message(
    schedule: PipelineSchedule, pos: list[int], done: dict, explicit: bool
) -> str:
    p = schedule.stages
    waits = []
    for r in range(p):
        if pos[r] == len(schedule.ranks[r]):
            continue
        a = schedule.ranks[r][pos[r]]
        j = schedule.virtual_stage(r, a.chunk)
        missing = [t for t, _ in _needs(a, j, explicit, schedule) if t not in done]
        what = "; ".join(f"{_describe(t)} from rank {schedule.rank_of(t[1])}" for t in missing)
        waits.append(f"rank {r} waits at action {a} (position {pos[r]}) for {what}")
    return "schedule deadlocks: " + "; ".join(waits)


def _describe(token: tuple) -> str:
    kind, j, i = token
    names = {
        "act": "the forward output",
        "grad": "the input gradient",
        "SF": "the activation",
        "SB": "the gradient",
        "RF": "a receive of the activation",
        "RB": "a receive of the gradient",
    }
    return f"{names.get(kind, kind)} of micro-batch {i} at virtual stage {j}"
