"""An event-driven scheduler for many parallel training jobs on one GPU cluster.

Time jumps from event to event (a ``heapq`` of submissions, finishes, node
failures and repairs); after each instant the scheduler walks the queue:

* **queue order**: higher priority first, then earlier submission; a job that
  does not fit is skipped and the next one may start (greedy backfilling
  without reservations, so a big job can wait while small ones slip past);
* **gang scheduling**: a job gets all its TP groups at once
  (:mod:`distlab.placement.allocate`, first-fit or best-fit) or waits, with the
  reason stated in its record;
* **preemption**: a job that does not fit may evict running jobs of strictly
  lower priority, lowest priority first (then the one that loses least). A
  victim stops at once, loses the work done since its last checkpoint, goes back
  to the queue and later resumes from that checkpoint, paying ``restart_s``;
* **node failures**: every job on the node loses the work since its last
  checkpoint. An ``elastic`` job drops the data-parallel replicas that touched
  the node and continues with fewer (not below ``min_dp``) after ``restart_s``;
  any other job is requeued. When GPUs come back, a shrunk job grows back to
  its full ``dp`` if nobody of equal or higher priority is waiting (a planned
  resize: it checkpoints, ``checkpoint_s``, and restarts, ``restart_s``, losing nothing);
* elastic jobs may also **start** with fewer replicas when the full job does not fit.

A job's work is ``duration_s`` seconds at full ``dp``; with ``dp' < dp`` it
runs at rate ``dp' / dp`` (the same global batch per step, fewer replicas).
While running it computes ``checkpoint_interval_s`` then spends
``checkpoint_s`` saving, over and over; work is safe once a save has finished.
Every GPU-second is accounted for in a :class:`~distlab.placement.records.JobRecord`
(useful, lost to preemption or failure, restarts, checkpoints);
:mod:`distlab.placement.stats` summarises a run.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from distlab.core.layout import Layout
from distlab.sim.topology import ClusterSpec

from .allocate import (
    POLICIES,
    Slot,
    allocate,
    gpus_per_slot_node,
    group_capacity,
    partial_node_fraction,
    stranded_fraction,
    take,
)
from .cluster import nvlink_group_limit, resolve_cluster
from .jobs import Job, as_job
from .records import JobRecord, TimelinePoint
from .stats import ScheduleStats, schedule_stats

SUBMIT, FINISH, FAIL, RECOVER = "submit", "finish", "fail", "recover"


@dataclass(frozen=True)
class NodeEvent:
    """A node goes down (``"fail"``) or comes back (``"recover"``) at ``time_s``."""

    time_s: float
    node: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in (FAIL, RECOVER):
            raise ValueError(f"NodeEvent kind must be 'fail' or 'recover', got {self.kind!r}")


def random_failures(
    cluster: ClusterSpec, *, mtbf_s: float, repair_s: float, horizon_s: float, seed: int = 0
) -> list[NodeEvent]:
    """Seeded node failures: each node fails after Exp(``mtbf_s``) seconds of uptime and is
    repaired ``repair_s`` later, until ``horizon_s``."""
    if mtbf_s <= 0 or repair_s < 0 or horizon_s <= 0:
        raise ValueError("mtbf_s and horizon_s must be > 0 and repair_s >= 0 seconds")
    rng = np.random.default_rng(seed)
    events = []
    for node in range(cluster.nodes):
        t = rng.exponential(mtbf_s)
        while t < horizon_s:
            events += [NodeEvent(t, node, FAIL), NodeEvent(t + repair_s, node, RECOVER)]
            t += repair_s + rng.exponential(mtbf_s)
    return sorted(events, key=lambda e: (e.time_s, e.node))


@dataclass
class ScheduleResult:
    """A finished simulation: one :class:`JobRecord` per job and the cluster's timeline."""

    cluster: ClusterSpec
    policy: str
    preemption: bool
    records: list[JobRecord]
    timeline: list[TimelinePoint]
    events: int

    def stats(self) -> ScheduleStats:
        """Summary numbers (:func:`distlab.placement.stats.schedule_stats`)."""
        return schedule_stats(
            self.records, self.timeline, policy=self.policy, world_size=self.cluster.world_size
        )


@dataclass
class _Run:
    idx: int
    dp: int
    slots: list[Slot]
    t0: float
    overhead: float
    epoch: int

    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for slot in self.slots for n in slot}))


class Scheduler:
    """Runs jobs on ``cluster`` with ``policy`` ("first-fit" or "best-fit"); see the module docstring."""

    def __init__(
        self,
        cluster: ClusterSpec | str | dict,
        *,
        policy: str = "best-fit",
        preemption: bool = True,
        failures: list[NodeEvent] = (),
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; allowed: {POLICIES}")
        self.cluster = resolve_cluster(cluster)
        self.policy, self.preemption = policy, preemption
        self.g = self.cluster.gpus_per_node
        self.failures = list(failures)
        for ev in self.failures:
            if not 0 <= ev.node < self.cluster.nodes:
                raise ValueError(
                    f"NodeEvent node {ev.node} does not exist (0..{self.cluster.nodes - 1})"
                )

    # -- the loop -----------------------------------------------------------------------------
    def run(self, jobs: list[Job | Layout]) -> ScheduleResult:
        """Simulate until every job is done or infeasible, or no event is left (then jobs that
        cannot run stay queued with a reason); failures after the last job ends are not replayed.
        A bare :class:`~distlab.core.layout.Layout` is the job ``f"job{i}"`` with the default
        scheduling (:func:`~distlab.placement.jobs.as_job`)."""
        jobs = [as_job(job, name=f"job{i}") for i, job in enumerate(jobs)]
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        self.free = np.full(self.cluster.nodes, self.g, dtype=np.int64)
        self.up = np.ones(self.cluster.nodes, dtype=bool)
        self.records = [JobRecord(job) for job in jobs]
        self.running: dict[int, _Run] = {}
        self.waiting: set[int] = set()
        self.timeline: list[TimelinePoint] = []
        self.heap: list = []
        self.seq = 0
        for i, job in enumerate(jobs):
            self._push(job.submit_s, SUBMIT, i)
        for ev in self.failures:
            self._push(ev.time_s, ev.kind, ev.node)
        events, self.unsettled = 0, len(jobs)  # jobs not yet done or infeasible
        while self.heap and self.unsettled:
            t, _, kind, payload = heapq.heappop(self.heap)
            events += 1
            self._handle(t, kind, payload)
            if not self.heap or self.heap[0][0] > t:
                self._schedule(t)
        return ScheduleResult(
            self.cluster, self.policy, self.preemption, self.records, self.timeline, events
        )

    def _push(self, t: float, kind: str, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def _handle(self, t: float, kind: str, payload) -> None:
        if kind == SUBMIT:
            self._submit(t, payload)
        elif kind == FINISH:
            idx, epoch = payload
            run = self.running.get(idx)
            if run is not None and run.epoch == epoch:
                self._finish(t, run)
        elif kind == FAIL:
            self._fail(t, payload)
        else:
            self._recover(payload)

    # -- events ---------------------------------------------------------------------------------
    def _submit(self, t: float, idx: int) -> None:
        rec = self.records[idx]
        reason = self._infeasible(rec.job)
        if reason:
            rec.state, rec.reason = "infeasible", reason
            self.unsettled -= 1
            return
        rec.state, rec.queued_since = "waiting", t
        self.waiting.add(idx)

    def _infeasible(self, job: Job) -> str:
        c, limit, tp = self.cluster, nvlink_group_limit(self.cluster), job.layout.tp
        smallest = _replica_gpus(job) * (job.min_dp if job.elastic else job.layout.dp)
        if smallest > c.world_size:
            return f"needs {smallest} GPUs, the cluster has {c.world_size}"
        if tp > limit:
            return f"tp={tp} exceeds the {limit} GPUs that share NVLink on {c.name}"
        if tp > self.g and tp % self.g:
            return f"tp={tp} spans nodes, so it must be a multiple of {self.g}"
        return ""

    def _finish(self, t: float, run: _Run) -> None:
        rec = self.records[run.idx]
        self._close_segment(t, run, finished=True)
        rec.state, rec.end_s, rec.work_done_s = "done", t, rec.job.duration_s
        self.unsettled -= 1
        self._release(run.slots, rec.job.layout.tp)
        del self.running[run.idx]

    def _fail(self, t: float, node: int) -> None:
        if not self.up[node]:
            return
        self.up[node], self.free[node] = False, 0
        for run in [r for r in self.running.values() if node in r.nodes()]:
            rec = self.records[run.idx]
            rec.failures += 1
            self._close_segment(t, run, lost_to="failure")
            job = rec.job
            per_replica = _groups_per_replica(job)
            replicas = [run.slots[k * per_replica : (k + 1) * per_replica] for k in range(run.dp)]
            keep = [r for r in replicas if all(node not in s for s in r)]
            dp_left = _valid_dp(job, len(keep))
            if job.elastic and dp_left >= job.min_dp:
                for dropped in keep[dp_left:] + [r for r in replicas if r not in keep]:
                    self._release([s for s in dropped], job.layout.tp)
                rec.resizes += 1
                run.slots = [s for r in keep[:dp_left] for s in r]
                run.dp = dp_left
                self._start_segment(t, run, overhead=job.restart_s)
            else:
                self._stop(t, run, reason=f"requeued: node {node} failed")

    def _recover(self, node: int) -> None:
        if self.up[node]:
            return
        self.up[node], self.free[node] = True, self.g

    # -- the scheduling pass -----------------------------------------------------------------------
    def _schedule(self, t: float) -> None:
        capacity: dict[int, int] = {}
        failed_preemptions: set = set()
        for idx in sorted(self.waiting, key=self._queue_key):
            rec = self.records[idx]
            job = rec.job
            tp, full_dp, world = job.layout.tp, job.layout.dp, job.layout.world_size
            if tp not in capacity:
                capacity[tp] = self._capacity(tp)
            fits = capacity[tp] // _groups_per_replica(job)
            dp = full_dp if fits >= full_dp else (_valid_dp(job, fits) if job.elastic else 0)
            if dp >= (job.min_dp if job.elastic else full_dp) and dp > 0:
                self._start(t, idx, dp)
                capacity.clear()
                continue
            key = (job.priority, tp, world)
            if self.preemption and key not in failed_preemptions:
                if self._preempt_for(t, idx):
                    capacity.clear()
                    continue
                failed_preemptions.add(key)
            rec.reason = (
                f"waiting for {world} GPUs in TP groups of {tp}: "
                f"{capacity.get(tp, 0)} such groups are free, {world // tp} needed"
            )
        self._grow(t)
        self._record(t)

    def _queue_key(self, idx: int):
        job = self.records[idx].job
        return (-job.priority, job.submit_s, idx)

    def _capacity(self, tp: int) -> int:
        return group_capacity(self.free, tp, self.g, self.cluster.nvlink_domain_nodes)

    def _allocate(self, free: np.ndarray, job: Job, dp: int) -> list[Slot] | None:
        n_groups = _groups_per_replica(job) * dp
        return allocate(
            free, n_groups, job.layout.tp, self.g, self.cluster.nvlink_domain_nodes, self.policy
        )

    def _start(self, t: float, idx: int, dp: int) -> None:
        rec = self.records[idx]
        slots = self._allocate(self.free, rec.job, dp)
        assert slots is not None  # capacity was checked
        take(self.free, slots, rec.job.layout.tp, self.g)
        self.waiting.discard(idx)
        rec.wait_s += t - rec.queued_since
        if rec.first_start_s is None:
            rec.first_start_s = t
        overhead = rec.job.restart_s if rec.work_done_s > 0 else 0.0
        run = _Run(idx, dp, slots, t, 0.0, 0)
        rec.state, rec.reason = "running", ""
        self.running[idx] = run
        self._start_segment(t, run, overhead)

    def _preempt_for(self, t: float, idx: int) -> bool:
        """Evict the fewest lowest-priority jobs that let job ``idx`` start at full size."""
        job = self.records[idx].job
        victims = [
            r for r in self.running.values() if self.records[r.idx].job.priority < job.priority
        ]
        if not victims:
            return False
        victims.sort(key=lambda r: (self.records[r.idx].job.priority, self._unsaved_gpu_s(t, r)))
        free = self.free.copy()
        chosen = []
        for run in victims:
            self._release(run.slots, self.records[run.idx].job.layout.tp, free)
            chosen.append(run)
            if self._allocate(free, job, job.layout.dp) is not None:
                for victim in chosen:
                    self.records[victim.idx].preemptions += 1
                    self._close_segment(t, victim, lost_to="preemption")
                    self._stop(t, victim, reason=f"requeued: preempted by {job.name!r}")
                self._start(t, idx, job.layout.dp)
                return True
        return False

    def _grow(self, t: float) -> None:
        top = max((self.records[w].job.priority for w in self.waiting), default=None)
        for run in list(self.running.values()):
            job = self.records[run.idx].job
            if run.dp == job.layout.dp or (top is not None and top >= job.priority):
                continue
            spare = self._capacity(job.layout.tp) // _groups_per_replica(job)
            extra = _valid_dp(job, run.dp + spare) - run.dp
            if extra <= 0:
                continue
            slots = self._allocate(self.free, job, extra)
            take(self.free, slots, job.layout.tp, self.g)
            self._close_segment(t, run)  # planned: checkpoint now, nothing lost
            rec = self.records[run.idx]
            rec.resizes += 1
            run.slots, run.dp = run.slots + slots, run.dp + extra
            self._start_segment(t, run, overhead=job.checkpoint_s + job.restart_s)

    # -- segments: one stretch of running with a fixed shape ---------------------------------------
    def _start_segment(self, t: float, run: _Run, overhead: float) -> None:
        rec = self.records[run.idx]
        job = rec.job
        self.seq += 1  # a fresh epoch: FINISH events of earlier segments become stale
        run.t0, run.overhead, run.epoch = t, overhead, self.seq
        compute = (job.duration_s - rec.work_done_s) / (run.dp / job.layout.dp)
        saves = max(0, math.ceil(compute / job.checkpoint_interval_s - 1e-9) - 1)
        self._push(t + overhead + compute + saves * job.checkpoint_s, FINISH, (run.idx, run.epoch))

    def _progress(self, t: float, run: _Run) -> tuple[float, float, float]:
        """(seconds computed, seconds computed and saved, seconds spent saving) in this segment."""
        job = self.records[run.idx].job
        elapsed = t - run.t0 - run.overhead
        if elapsed <= 0:
            return 0.0, 0.0, 0.0
        cycle = job.checkpoint_interval_s + job.checkpoint_s
        k = math.floor(elapsed / cycle)
        rest = elapsed - k * cycle
        computed = k * job.checkpoint_interval_s + min(rest, job.checkpoint_interval_s)
        saving = k * job.checkpoint_s + max(0.0, rest - job.checkpoint_interval_s)
        return computed, k * job.checkpoint_interval_s, saving

    def _unsaved_gpu_s(self, t: float, run: _Run) -> float:
        computed, saved, _ = self._progress(t, run)
        return (computed - saved) * self._gpus(run)

    def _gpus(self, run: _Run) -> int:
        job = self.records[run.idx].job
        return len(run.slots) * job.layout.tp

    def _close_segment(
        self, t: float, run: _Run, lost_to: str | None = None, finished=False
    ) -> None:
        """Account the segment ``[run.t0, t]``; ``lost_to``: roll back to the last checkpoint."""
        rec = self.records[run.idx]
        job, gpus = rec.job, self._gpus(run)
        computed, saved, saving = self._progress(t, run)
        if finished:
            computed = (job.duration_s - rec.work_done_s) * job.layout.dp / run.dp
            saving = t - run.t0 - run.overhead - computed
            saved = computed
        kept = saved if lost_to else computed
        rec.work_done_s += kept * run.dp / job.layout.dp
        rec.useful_gpu_s += kept * gpus
        rec.checkpoint_gpu_s += saving * gpus
        rec.restart_gpu_s += min(t - run.t0, run.overhead) * gpus
        if lost_to == "preemption":
            rec.lost_preemption_gpu_s += (computed - saved) * gpus
        elif lost_to == "failure":
            rec.lost_failure_gpu_s += (computed - saved) * gpus
        rec.segments.append((run.t0, t, gpus, run.nodes()))

    def _stop(self, t: float, run: _Run, reason: str) -> None:
        rec = self.records[run.idx]
        self._release(run.slots, rec.job.layout.tp)
        del self.running[run.idx]
        rec.state, rec.reason, rec.queued_since = "waiting", reason, t
        self.waiting.add(run.idx)

    def _release(self, slots: list[Slot], tp: int, free: np.ndarray | None = None) -> None:
        free = self.free if free is None else free
        per_node = gpus_per_slot_node(tp, self.g)
        for slot in slots:
            for node in slot:
                if self.up[node]:
                    free[node] += per_node

    def _record(self, t: float) -> None:
        tps = [self.records[i].job.layout.tp for i in self.waiting]
        busy = sum(self._gpus(r) for r in self.running.values())
        point = TimelinePoint(
            time_s=t,
            busy_gpus=busy,
            up_gpus=int(self.up.sum()) * self.g,
            waiting=len(self.waiting),
            stranded=stranded_fraction(self.free, min(tps) if tps else None, self.g),
            partial=partial_node_fraction(self.free, self.g),
        )
        if self.timeline and self.timeline[-1].time_s == t:
            self.timeline[-1] = point
        else:
            self.timeline.append(point)


def _groups_per_replica(job: Job) -> int:
    """TP groups in one data-parallel replica: ``cp * pp``."""
    return job.layout.cp * job.layout.pp


def _replica_gpus(job: Job) -> int:
    """GPUs of one data-parallel replica: ``tp * cp * pp``."""
    return job.layout.tp * _groups_per_replica(job)


def _valid_dp(job: Job, replicas: int) -> int:
    """The largest data-parallel degree <= min(replicas, job.layout.dp) that ``ep`` still divides."""
    for dp in range(min(replicas, job.layout.dp), 0, -1):
        if (job.layout.cp * dp) % job.layout.ep == 0:
            return dp
    return 0


def simulate(
    jobs: list[Job | Layout],
    cluster: ClusterSpec | str | dict,
    *,
    policy: str = "best-fit",
    preemption: bool = True,
    failures: list[NodeEvent] = (),
) -> ScheduleResult:
    """Run ``jobs`` on ``cluster`` with the event-driven :class:`Scheduler`."""
    return Scheduler(cluster, policy=policy, preemption=preemption, failures=failures).run(jobs)
