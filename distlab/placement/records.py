"""What a scheduler run writes down: one record per job, and the cluster after every instant.

:mod:`distlab.placement.scheduler` fills these in as it runs;
:mod:`distlab.placement.stats` summarises them; neither needs the other's types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobs import Job


@dataclass
class JobRecord:
    """What happened to one job. Times in seconds; ``*_gpu_s`` in GPU-seconds."""

    job: Job
    state: str = "waiting"  # waiting, running, done, infeasible
    reason: str = ""
    first_start_s: float | None = None
    end_s: float | None = None
    wait_s: float = 0.0  # total time queued (first wait and every requeue)
    work_done_s: float = 0.0  # work saved or finished, in seconds at full dp
    preemptions: int = 0
    failures: int = 0
    resizes: int = 0
    lost_preemption_gpu_s: float = 0.0
    lost_failure_gpu_s: float = 0.0
    restart_gpu_s: float = 0.0
    checkpoint_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    segments: list[tuple[float, float, int, tuple[int, ...]]] = field(default_factory=list)
    queued_since: float = 0.0


@dataclass(frozen=True)
class TimelinePoint:
    """The cluster after the scheduler acted at ``time_s``."""

    time_s: float
    busy_gpus: int
    up_gpus: int
    waiting: int
    stranded: float  # stranded_fraction for the smallest waiting TP group
    partial: float  # partial_node_fraction
