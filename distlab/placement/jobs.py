"""A training job as the placer and the scheduler see it: its layout, its model and its life.

A :class:`~distlab.core.layout.Layout` holds the degrees (tp, cp, ep, pp, dp),
the rank order and the settings that set the traffic (micro-batch size and
count, ZeRO stage), validated there once. :class:`Workload` is the model whose
size sets the communication volumes (layers, hidden size, sequence length);
:class:`Job` puts a name, a layout and a workload together with what the
scheduler needs: priority, submit time, run time, checkpoint interval and
costs, and whether data parallelism is elastic. :func:`~distlab.placement.place`
and the scheduler take a ``Job`` or a bare ``Layout`` (:func:`as_job`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distlab.core.checks import int_in, positive_int
from distlab.core.layout import Layout


@dataclass(frozen=True)
class Workload:
    """The model whose size sets communication volumes (defaults: a 7B-class GPT).

    ``n_params`` defaults to the transformer blocks' ``12 * layers * hidden**2``
    (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
    GPU Clusters Using Megatron-LM", Section 5.1, without embeddings);
    ``bytes_per_value`` = 2 for bf16 activations and gradients. How the model is
    run (micro-batches, ZeRO stage) is the job's :class:`~distlab.core.layout.Layout`.
    """

    layers: int = 32
    hidden: int = 4096
    seq_len: int = 4096
    n_params: float | None = None
    bytes_per_value: int = 2

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "seq_len", "bytes_per_value"):
            positive_int(f"Workload.{name}", getattr(self, name))
        if self.n_params is not None and not self.n_params > 0:
            raise ValueError(f"Workload.n_params must be > 0, got {self.n_params!r}")

    @property
    def params(self) -> float:
        """Parameter count: ``n_params`` or ``12 * layers * hidden**2``."""
        return self.n_params if self.n_params is not None else 12 * self.layers * self.hidden**2


@dataclass(frozen=True)
class Job:
    """One training job: a name, its :class:`~distlab.core.layout.Layout`, its
    :class:`Workload`, and what a scheduler needs to know.

    ``layout`` holds the degrees (``layout.world_size = tp * cp * dp * pp`` GPUs; ``ep``
    re-splits ``cp * dp``, see :mod:`distlab.core.ranks`) and the rank order.

    Scheduling (seconds): ``duration_s`` of work at full data parallelism,
    a checkpoint every ``checkpoint_interval_s`` of work costing ``checkpoint_s``,
    ``restart_s`` to resume from a checkpoint. ``elastic``: when GPUs are lost
    the job may shrink ``dp`` (not below ``min_dp``) and continue, and grows back later.
    Higher ``priority`` wins.
    """

    name: str
    layout: Layout
    workload: Workload = field(default_factory=Workload)
    priority: int = 0
    submit_s: float = 0.0
    duration_s: float = 3600.0
    checkpoint_interval_s: float = 1800.0
    checkpoint_s: float = 60.0
    restart_s: float = 120.0
    elastic: bool = False
    min_dp: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.layout, Layout):
            raise TypeError(
                f"job {self.name!r}: layout must be a distlab.core.layout.Layout, "
                f"got {self.layout!r}"
            )
        for name in ("duration_s", "checkpoint_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"job {self.name!r}: {name} must be > 0 seconds, got {getattr(self, name)!r}"
                )
        for name in ("submit_s", "checkpoint_s", "restart_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(
                    f"job {self.name!r}: {name} must be >= 0 seconds, got {getattr(self, name)!r}"
                )
        int_in(f"job {self.name!r}: min_dp (at most dp)", self.min_dp, 1, self.layout.dp)


def as_job(job: Job | Layout, name: str = "job") -> Job:
    """``job`` itself, or a bare :class:`~distlab.core.layout.Layout` as a :class:`Job`
    called ``name`` with the default workload and scheduling."""
    if isinstance(job, Layout):
        return Job(name, job)
    if not isinstance(job, Job):
        raise TypeError(f"expected a Job or a distlab.core.layout.Layout, got {job!r}")
    return job


#: (probability, tp, pp, dp) of the mixed workload's shapes, for 8-GPU nodes.
MIXED_SHAPES = (
    (0.30, 1, 1, 1),
    (0.15, 2, 1, 1),
    (0.15, 4, 1, 1),
    (0.10, 2, 1, 2),
    (0.15, 8, 1, 1),
    (0.10, 8, 2, 2),
    (0.05, 8, 4, 4),
)


def mixed_jobs(
    n_jobs: int,
    *,
    cluster_gpus: int,
    load: float = 1.0,
    gpus_per_node: int = 8,
    seed: int = 0,
    elastic_fraction: float = 0.2,
) -> list[Job]:
    """A seeded queue of ``n_jobs`` jobs of mixed shapes, sizes and priorities.

    Shapes from :data:`MIXED_SHAPES` (tp capped at ``gpus_per_node``); run times
    log-normal around 2 h; priorities 0 (70%), 1 (25%), 2 (5%); Poisson arrivals
    whose rate offers ``load`` times the cluster's GPU-seconds. Multi-replica jobs
    are elastic with probability ``elastic_fraction`` (min_dp = dp // 2).
    """
    n_jobs = positive_int("n_jobs", n_jobs)
    if not load > 0:
        raise ValueError(f"load must be > 0, got {load!r}")
    rng = np.random.default_rng(seed)
    probs = np.array([s[0] for s in MIXED_SHAPES])
    shapes = rng.choice(len(MIXED_SHAPES), size=n_jobs, p=probs / probs.sum())
    durations = rng.lognormal(mean=np.log(7200.0), sigma=0.8, size=n_jobs)
    priorities = rng.choice([0, 1, 2], size=n_jobs, p=[0.70, 0.25, 0.05])
    elastic = rng.random(n_jobs) < elastic_fraction
    sizes = [
        min(MIXED_SHAPES[k][1], gpus_per_node) * MIXED_SHAPES[k][2] * MIXED_SHAPES[k][3]
        for k in shapes
    ]
    mean_gap = float(np.mean(np.array(sizes) * durations)) / (cluster_gpus * load)
    arrivals = np.cumsum(rng.exponential(mean_gap, size=n_jobs)) - mean_gap
    jobs = []
    for i, k in enumerate(shapes):
        _, tp, pp, dp = MIXED_SHAPES[k]
        jobs.append(
            Job(
                name=f"job{i:04d}",
                layout=Layout(tp=min(tp, gpus_per_node), pp=pp, dp=dp),
                priority=int(priorities[i]),
                submit_s=float(max(arrivals[i], 0.0)),
                duration_s=float(durations[i]),
                checkpoint_interval_s=1800.0,
                checkpoint_s=60.0,
                restart_s=120.0,
                elastic=bool(elastic[i] and dp > 1),
                min_dp=max(1, dp // 2),
            )
        )
    return jobs
