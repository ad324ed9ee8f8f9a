"""Replay a pipeline schedule on a modelled cluster: compute costs plus alpha-beta sends.

The schedule is the one type of :mod:`distlab.core.pipeline_schedule`, timed
by the one replay of :mod:`distlab.sim.pipeline_replay`; this module only
says what a message costs. Pipeline
rank r runs on GPU ``gpus[r]`` of a :class:`~distlab.sim.topology.ClusterSpec`;
an activation (forward) or its gradient (backward) of ``message_bytes``
from rank a to rank b takes

    alpha + message_bytes / bandwidth

on the route between their GPUs (:meth:`ClusterSpec.route`: the latency of
the path and the slowest port on it). Pipeline neighbours exchange one
message at a time in each direction, so link sharing is not modelled here
(:func:`distlab.sim.simulate` does that for collectives).

For a tensor of b s h elements (micro-batch, sequence, hidden) in 16-bit,
``message_bytes = 2 b s h`` (:func:`distlab.calc.comm.pipeline_parallel_comm`
counts the same per micro-batch).
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.core.checks import int_in
from distlab.core.pipeline_schedule import PipelineSchedule
from distlab.sim.pipeline_replay import Timeline, replay

from .topology import ClusterSpec


def p2p_seconds(cluster: ClusterSpec, src_gpu: int, dst_gpu: int, message_bytes: float) -> float:
    """alpha + bytes / bandwidth of the slowest port on the route (0 on the same GPU)."""
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes!r}")
    route = cluster.route(src_gpu, dst_gpu)
    if not route.ports:
        return 0.0
    return route.alpha + message_bytes / min(bandwidth for _, bandwidth in route.ports)


def simulate_pipeline(
    schedule: PipelineSchedule,
    cluster: ClusterSpec,
    *,
    message_bytes: float,
    forward_time: float | Sequence[float],
    backward_time: float | Sequence[float],
    weight_fraction: float = 0.5,
    gpus: Sequence[int] | None = None,
) -> Timeline:
    """Time ``schedule`` with per-stage compute costs (seconds; a float is per rank's
    whole stage, a sequence one entry per virtual stage, e.g. measured) and the
    cluster's point-to-point costs. ``gpus[r]``: the GPU pipeline rank r runs on
    (default: GPU r). Returns the timeline; ``.bubble_fraction`` is the idle share."""
    p = schedule.stages
    gpus = list(range(p)) if gpus is None else list(gpus)
    if len(gpus) != p:
        raise ValueError(f"gpus lists {len(gpus)} GPUs for a schedule of {p} ranks")
    for g in gpus:
        int_in(f"gpu of cluster {cluster.name!r}", g, 0, cluster.world_size - 1)
    costs = {
        (a, b): p2p_seconds(cluster, gpus[a], gpus[b], message_bytes)
        for a in range(p)
        for b in range(p)
    }
    return replay(
        schedule,
        forward_time=forward_time,
        backward_time=backward_time,
        weight_fraction=weight_fraction,
        p2p_time=lambda src, dst: costs[(src, dst)],
    )
