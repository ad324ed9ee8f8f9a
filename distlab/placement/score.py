"""Score a placement: estimated communication seconds per training step.

For every parallel dimension the score multiplies

    calls per step x (time of one call on the links this placement gives that dimension)

and adds the dimensions up (no overlap with compute or with each other: an
upper bound that ranks placements, not a step-time prediction).

* **Volumes** (what each rank sends): :func:`comm_volumes`, from
  :mod:`distlab.calc.comm` for TP, PP and DP (ZeRO stages included); CP and EP
  are not in ``distlab.calc.comm`` yet, so a small adapter here counts them.
* **Time of one call**: the closed forms of :mod:`distlab.sim.cost`
  (``ring_all_reduce``: ``2(n-1) alpha + 2(n-1)/n N beta``; ring reduce-scatter
  and all-gather ``(n-1) alpha + (n-1)/n N beta``; ``all_to_all``: the same;
  a point-to-point message: ``alpha + N beta``)
  evaluated on each group's **slowest link**: the largest latency and the
  smallest bandwidth among the messages of one round, where bandwidth is
  shared by messages that cross the same port at once
  (:func:`~distlab.placement.cluster.edge_costs`). All groups of a dimension
  run at the same time; the slowest group sets the dimension's time.

Rings follow the GPUs' order in the cluster (as NCCL orders a ring by topology),
so a group that spans two nodes crosses the network twice per ring, not at every hop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from distlab.calc import comm as calc_comm
from distlab.sim.algorithms import closed_form

from .cluster import ROUTE_KINDS, edge_costs
from .jobs import Job, Workload

#: Collectives whose time is a ring closed form of :mod:`distlab.sim.cost`.
RING_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Volume:
    """One dimension's traffic per step: ``calls`` collectives of ``n_bytes`` each (per rank).

    ``collective``: ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``all_to_all``,
    ``send_recv`` (pipeline neighbours) or ``ring_send_recv`` (ring attention).
    """

    dimension: str
    what: str
    collective: str
    n_bytes: float
    calls: float


def comm_volumes(job: Job, workload: Workload | None = None) -> list[Volume]:
    """Bytes per call and calls per step for each dimension of ``job`` whose degree is > 1.

    One pipeline stage holds ``ceil(L / pp)`` layers (the busiest stage sets the
    pace) and each context-parallel rank ``ceil(s / cp)`` tokens of the sequence.

    * TP: :func:`distlab.calc.comm.tensor_parallel_comm` (four all-reduces of
      ``b s h B`` per layer and micro-batch; Shoeybi et al. 2019, Section 3);
    * PP: :func:`distlab.calc.comm.pipeline_parallel_comm` (``b s h B / tp`` per
      micro-batch each way; Narayanan et al. 2021, Section 4.1);
    * DP: :func:`distlab.calc.comm.data_parallel_comm` over the ``dp x cp`` ranks
      that hold the same weights, with the workload's ZeRO stage;
    * CP and EP: :func:`context_parallel_volume`, :func:`expert_parallel_volume`
      (adapter: not in ``distlab.calc.comm`` yet).
    """
    w = workload or job.workload
    layers = math.ceil(w.layers / job.pp)
    tokens = math.ceil(w.seq_len / job.cp)
    shape = {
        "seq_len": tokens,
        "micro_batch": w.micro_batch,
        "hidden": w.hidden,
        "bytes_per_element": w.bytes_per_value,
    }
    volumes: list[Volume] = []
    if job.tp > 1:
        tp = calc_comm.tensor_parallel_comm(
            **shape, layers=layers, tp=job.tp, micro_batches=w.micro_batches
        )
        volumes += _merge("tp", tp)
    if job.cp > 1:
        volumes.append(
            context_parallel_volume(job.cp, layers=layers, micro_batches=w.micro_batches, **shape)
        )
    if job.ep > 1:
        volumes.append(
            expert_parallel_volume(layers=layers, micro_batches=w.micro_batches, **shape)
        )
    if job.pp > 1:
        pp = calc_comm.pipeline_parallel_comm(
            **shape, micro_batches=w.micro_batches, pp=job.pp, tp=job.tp
        )
        volumes += _merge("pp", pp)
    if job.dp * job.cp > 1:
        dp = calc_comm.data_parallel_comm(
            w.params / (job.tp * job.pp),
            dp=job.dp * job.cp,
            zero_stage=w.zero_stage,
            bytes_per_param=w.bytes_per_value,
            bytes_per_grad=w.bytes_per_value,
            micro_batches=w.micro_batches,
        )
        volumes += _merge("dp", dp)
    return volumes


def _merge(dimension: str, volume) -> list[Volume]:
    """calc's parts as :class:`Volume` s, parts with the same collective and size merged."""
    merged: dict[tuple[str, float], Volume] = {}
    for part in volume.parts:
        key = (part.collective, part.payload_bytes)
        if key in merged:
            old = merged[key]
            merged[key] = Volume(
                dimension,
                f"{old.what}; {part.what}",
                old.collective,
                old.n_bytes,
                old.calls + part.count,
            )
        else:
            merged[key] = Volume(
                dimension, part.what, part.collective, part.payload_bytes, part.count
            )
    return list(merged.values())


def context_parallel_volume(
    cp: int,
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers: int,
    micro_batches: int,
    bytes_per_element: int,
) -> Volume:
    """Ring attention: each layer passes the K and V blocks of ``seq_len`` local tokens
    (``2 b s h B``) around the ring ``cp - 1`` times in the forward, and K, V and their
    gradients in the backward: ``3 (cp-1) L m`` messages (Liu et al. 2023,
    "Ring Attention with Blockwise Transformers"; full multi-head K and V, no GQA).
    Adapter until :mod:`distlab.calc.comm` counts context parallelism."""
    kv = 2 * micro_batch * seq_len * hidden * bytes_per_element
    return Volume(
        "cp",
        "ring attention K/V blocks",
        "ring_send_recv",
        kv,
        3 * (cp - 1) * layers * micro_batches,
    )


def expert_parallel_volume(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers: int,
    micro_batches: int,
    bytes_per_element: int,
) -> Volume:
    """Every layer an MoE layer with top-1 routing: dispatch and combine all-to-alls of the
    local tokens (``b s h B``) forward and backward, ``4 L m`` calls (Lepikhin et al. 2021,
    "GShard", Section 2). Adapter until :mod:`distlab.calc.comm` counts expert parallelism."""
    tokens = micro_batch * seq_len * hidden * bytes_per_element
    return Volume("ep", "MoE dispatch/combine", "all_to_all", tokens, 4 * layers * micro_batches)


@dataclass(frozen=True)
class DimensionCost:
    """One dimension's share of the score. Times in seconds, bandwidth in bytes/s."""

    dimension: str
    collective: str
    group_size: int
    n_groups: int
    n_bytes: float
    calls: float
    slowest_link: str  # route kind of the slowest message ("nvlink", "network", ...)
    alpha: float
    bandwidth: float
    time_per_call_s: float

    @property
    def time_s(self) -> float:
        return self.calls * self.time_per_call_s


@dataclass(frozen=True)
class CommScore:
    """Communication seconds per step of one placement: ``.total`` and one entry per dimension."""

    parts: tuple[DimensionCost, ...]

    @property
    def total(self) -> float:
        return sum(p.time_s for p in self.parts)

    def breakdown(self) -> dict[str, float]:
        """Seconds per step per dimension."""
        out: dict[str, float] = {}
        for p in self.parts:
            out[p.dimension] = out.get(p.dimension, 0.0) + p.time_s
        return out

    def part(self, dimension: str) -> DimensionCost | None:
        """The (first) cost entry of ``dimension``; ZeRO-1..3 give DP more than one."""
        return next((p for p in self.parts if p.dimension == dimension), None)


def score_groups(
    cluster, gpu_groups: dict[str, np.ndarray], job: Job, workload: Workload | None = None
) -> CommScore:
    """Score a placement given each dimension's groups as GPU ids (``(n_groups, size)`` arrays).

    ``gpu_groups`` needs the keys ``"tp"``, ``"cp"``, ``"ep"``, ``"pp"`` and ``"dp-cp"``.
    """
    parts = []
    for vol in comm_volumes(job, workload):
        key = "dp-cp" if vol.dimension == "dp" else vol.dimension
        groups = np.asarray(gpu_groups[key])
        parts.append(_dimension_cost(cluster, vol, groups))
    return CommScore(tuple(parts))


def _dimension_cost(cluster, vol: Volume, groups: np.ndarray) -> DimensionCost:
    n_groups, n = groups.shape
    collective = vol.collective in RING_COLLECTIVES or vol.collective == "all_to_all"
    if collective:
        ring = np.sort(groups, axis=1)  # NCCL-like: ring in topology order
        src, dst = ring, np.roll(ring, -1, axis=1)
    elif vol.collective == "ring_send_recv":
        src, dst = groups, np.roll(groups, -1, axis=1)  # ring attention follows rank order
    else:  # pipeline: stage i -> stage i + 1, all boundaries at once
        src, dst = groups[:, :-1], groups[:, 1:]
    costs = edge_costs(cluster, src.ravel(), dst.ravel())
    width = src.shape[1]
    alpha = costs.alpha.reshape(n_groups, width).max(axis=1)
    bandwidth = costs.bandwidth.reshape(n_groups, width).min(axis=1)
    if collective:
        name = "all_to_all" if vol.collective == "all_to_all" else f"ring_{vol.collective}"
        formula = closed_form(name, n)
        per_group = formula.alpha_terms * alpha + formula.beta_factor * vol.n_bytes / bandwidth
    else:  # one message per call on each edge: alpha + N / bandwidth
        per_group = alpha + vol.n_bytes / bandwidth
    worst = int(np.argmax(per_group))
    edge_times = (costs.alpha + vol.n_bytes / costs.bandwidth).reshape(n_groups, width)[worst]
    slowest_kind = ROUTE_KINDS[
        int(costs.kind.reshape(n_groups, width)[worst][np.argmax(edge_times)])
    ]
    return DimensionCost(
        dimension=vol.dimension,
        collective=vol.collective,
        group_size=n,
        n_groups=n_groups,
        n_bytes=vol.n_bytes,
        calls=vol.calls,
        slowest_link=slowest_kind,
        alpha=float(alpha[worst]),
        bandwidth=float(bandwidth[worst]),
        time_per_call_s=float(per_group[worst]),
    )
