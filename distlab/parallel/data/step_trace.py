"""Timestamps of one training step, per gradient bucket: is communication hidden?

For each bucket, :class:`BucketedDDP <distlab.parallel.data.ddp.BucketedDDP>`
records when its last gradient was produced (``ready``), when its all-reduce
started on the communication thread (``start``) and when it ended
(``end``); for the step, when forward started and ended and when backward
ended. Overlap is the part of each all-reduce that runs before backward has
finished: time that costs nothing extra, because the rank is computing anyway
(Li et al. 2020, Section 3.2.3 and Figure 6, and Section 5's measurements).

All times are :func:`time.perf_counter` seconds; :meth:`StepTrace.relative`
shifts them so the step starts at 0. They are host times: on CPU they are when
the work ran; on a GPU (asynchronous kernels) they would only say when it was
queued, and a faithful GPU trace needs CUDA events or the PyTorch profiler.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from distlab.parallel.comm.collectives import now


@dataclass
class BucketTimes:
    """One bucket's all-reduce in one step."""

    bucket: int
    n_bytes: int
    ready: float = float("nan")
    start: float = float("nan")
    end: float = float("nan")


@dataclass
class StepTrace:
    """One step: forward, backward and every bucket's communication."""

    forward_start: float = float("nan")
    forward_end: float = float("nan")
    backward_end: float = float("nan")
    sync_end: float = float("nan")
    buckets: list[BucketTimes] = field(default_factory=list)

    @property
    def comm_seconds(self) -> float:
        """Total time the communication thread spent in all-reduces."""
        return sum(b.end - b.start for b in self.buckets)

    @property
    def overlapped_seconds(self) -> float:
        """Communication time that ran while backward was still computing."""
        return sum(
            max(0.0, min(b.end, self.backward_end) - max(b.start, self.forward_end))
            for b in self.buckets
        )

    @property
    def exposed_seconds(self) -> float:
        """Time from the end of backward until the last all-reduce finished."""
        return self.sync_end - self.backward_end

    def relative(self) -> StepTrace:
        """The same trace with ``forward_start`` at time 0."""
        t0 = self.forward_start

        def shift(x: float) -> float:
            return x - t0

        return StepTrace(
            shift(self.forward_start),
            shift(self.forward_end),
            shift(self.backward_end),
            shift(self.sync_end),
            [
                replace(b, ready=shift(b.ready), start=shift(b.start), end=shift(b.end))
                for b in self.buckets
            ],
        )


class TraceRecorder:
    """Collects :class:`StepTrace` records (thread-safe: the comm thread writes too).

    Keeps the last ``keep`` steps so that a long run does not grow without bound.
    """

    def __init__(self, bucket_bytes: list[int], keep: int = 100):
        self.bucket_bytes = list(bucket_bytes)
        self.keep = keep
        self.steps: list[StepTrace] = []
        self._lock = threading.Lock()
        self._current: StepTrace | None = None

    def _step(self) -> StepTrace:
        if self._current is None:
            self._current = StepTrace(
                buckets=[BucketTimes(i, n) for i, n in enumerate(self.bucket_bytes)]
            )
        return self._current

    def forward_start(self) -> None:
        with self._lock:
            self._step().forward_start = now()

    def forward_end(self) -> None:
        with self._lock:
            self._step().forward_end = now()

    def bucket(self, index: int, what: str) -> None:
        """Record ``what`` (``"ready"``, ``"start"`` or ``"end"``) for bucket ``index`` now."""
        with self._lock:
            setattr(self._step().buckets[index], what, now())

    def backward_end(self) -> None:
        with self._lock:
            self._step().backward_end = now()

    def sync_end(self) -> None:
        """Close the step (all of its communication has finished)."""
        with self._lock:
            step = self._step()
            step.sync_end = now()
            self.steps = [*self.steps, step][-self.keep :]
            self._current = None
