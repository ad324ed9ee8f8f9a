"""Numbers that summarise a scheduler run: utilisation, waits, lost work, fragmentation.

Time averages weight each :class:`~distlab.placement.records.TimelinePoint`
by how long the cluster stayed in that state (until the next point), over
``[first submission, last event]``. GPU-hours are ``GPU-seconds / 3600``.
The functions take a run's records and timeline, so a
:class:`~distlab.placement.scheduler.ScheduleResult` summarises itself with
``result.stats()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .records import JobRecord, TimelinePoint


@dataclass(frozen=True)
class WaitStats:
    """Queueing time of the jobs of one priority that started at least once (seconds)."""

    jobs: int
    mean_s: float
    median_s: float
    max_s: float


@dataclass(frozen=True)
class ScheduleStats:
    """One run of the scheduler in numbers."""

    policy: str
    jobs: int
    completed: int
    infeasible: int
    unfinished: int
    makespan_s: float
    utilisation: float  # time-averaged busy GPUs / all GPUs
    mean_wait_s: float
    wait_by_priority: dict[int, WaitStats]
    preemptions: int
    failures_hit: int
    resizes: int
    useful_gpu_h: float
    lost_to_preemption_gpu_h: float
    lost_to_failures_gpu_h: float
    restart_gpu_h: float
    checkpoint_gpu_h: float
    mean_stranded: float  # time-averaged stranded_fraction
    mean_partial_node_free: float  # time-averaged partial_node_fraction

    def rows(self) -> list[tuple[str, str]]:
        """(name, value) pairs for a table."""
        rows = [
            ("policy", self.policy),
            (
                "jobs (completed / infeasible / unfinished)",
                f"{self.jobs} ({self.completed} / {self.infeasible} / {self.unfinished})",
            ),
            ("makespan", f"{self.makespan_s / 3600:.1f} h"),
            ("utilisation", f"{self.utilisation:.1%}"),
            ("mean wait", f"{self.mean_wait_s / 60:.1f} min"),
        ]
        for p, w in sorted(self.wait_by_priority.items()):
            rows.append(
                (
                    f"wait, priority {p} (mean / median / max)",
                    f"{w.mean_s / 60:.1f} / {w.median_s / 60:.1f} / {w.max_s / 60:.1f} min",
                )
            )
        rows += [
            (
                "preemptions / failures hit / resizes",
                f"{self.preemptions} / {self.failures_hit} / {self.resizes}",
            ),
            ("useful work", f"{self.useful_gpu_h:.0f} GPU-h"),
            ("lost to preemption", f"{self.lost_to_preemption_gpu_h:.1f} GPU-h"),
            ("lost to failures", f"{self.lost_to_failures_gpu_h:.1f} GPU-h"),
            (
                "restarts / checkpoints",
                f"{self.restart_gpu_h:.1f} / {self.checkpoint_gpu_h:.1f} GPU-h",
            ),
            ("stranded free GPUs (time avg)", f"{self.mean_stranded:.1%}"),
            ("free GPUs on partly used nodes (time avg)", f"{self.mean_partial_node_free:.1%}"),
        ]
        return rows


def timeline_arrays(timeline: Sequence[TimelinePoint]) -> dict[str, np.ndarray]:
    """A run's timeline as arrays: ``time_s``, ``busy``, ``up``, ``waiting``, ``stranded``,
    ``partial``, and ``dt`` (how long each state lasted; the last lasts 0)."""
    tl = timeline
    t = np.array([p.time_s for p in tl], dtype=float)
    return {
        "time_s": t,
        "dt": np.diff(t, append=t[-1]) if len(t) else t,
        "busy": np.array([p.busy_gpus for p in tl], dtype=float),
        "up": np.array([p.up_gpus for p in tl], dtype=float),
        "waiting": np.array([p.waiting for p in tl], dtype=float),
        "stranded": np.array([p.stranded for p in tl], dtype=float),
        "partial": np.array([p.partial for p in tl], dtype=float),
    }


def schedule_stats(
    records: Sequence[JobRecord],
    timeline: Sequence[TimelinePoint],
    *,
    policy: str,
    world_size: int,
) -> ScheduleStats:
    """Summarise a run on ``world_size`` GPUs: its job ``records`` and ``timeline``
    (see the module docstring for how averages are taken)."""
    recs = records
    arr = timeline_arrays(timeline)
    total_time = float(arr["dt"].sum())

    def time_avg(values: np.ndarray) -> float:
        return float((values * arr["dt"]).sum() / total_time) if total_time > 0 else 0.0

    started = [r for r in recs if r.first_start_s is not None]
    by_priority: dict[int, list[float]] = {}
    for r in started:
        by_priority.setdefault(r.job.priority, []).append(r.wait_s)
    waits = {
        p: WaitStats(len(w), float(np.mean(w)), float(np.median(w)), float(np.max(w)))
        for p, w in by_priority.items()
    }
    gpu_h = 1 / 3600
    return ScheduleStats(
        policy=policy,
        jobs=len(recs),
        completed=sum(r.state == "done" for r in recs),
        infeasible=sum(r.state == "infeasible" for r in recs),
        unfinished=sum(r.state in ("waiting", "running") for r in recs),
        makespan_s=float(arr["time_s"][-1] - arr["time_s"][0]) if len(arr["time_s"]) else 0.0,
        utilisation=time_avg(arr["busy"]) / world_size,
        mean_wait_s=float(np.mean([r.wait_s for r in started])) if started else 0.0,
        wait_by_priority=waits,
        preemptions=sum(r.preemptions for r in recs),
        failures_hit=sum(r.failures for r in recs),
        resizes=sum(r.resizes for r in recs),
        useful_gpu_h=sum(r.useful_gpu_s for r in recs) * gpu_h,
        lost_to_preemption_gpu_h=sum(r.lost_preemption_gpu_s for r in recs) * gpu_h,
        lost_to_failures_gpu_h=sum(r.lost_failure_gpu_s for r in recs) * gpu_h,
        restart_gpu_h=sum(r.restart_gpu_s for r in recs) * gpu_h,
        checkpoint_gpu_h=sum(r.checkpoint_gpu_s for r in recs) * gpu_h,
        mean_stranded=time_avg(arr["stranded"]),
        mean_partial_node_free=time_avg(arr["partial"]),
    )
