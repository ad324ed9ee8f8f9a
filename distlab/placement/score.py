"""Score a placement: estimated communication seconds per training step.

For every parallel dimension the score multiplies

    calls per step x (time of one call on the links this placement gives that dimension)

and adds the dimensions up (no overlap with compute or with each other: an
upper bound that ranks placements, not a step-time prediction).

* **Volumes** (what each rank sends): :func:`comm_volumes`, from the
  workload's shapes. See the note there about :mod:`distlab.calc.comm`.
* **Time of one call**: the closed forms of :mod:`distlab.sim.cost`
  (``ring_all_reduce``: ``2(n-1) alpha + 2(n-1)/n N beta``; ``all_to_all``:
  ``(n-1) alpha + (n-1)/n N beta``; a point-to-point message: ``alpha + N beta``)
  evaluated on each group's **slowest link**: the largest latency and the
  smallest bandwidth among the messages of one round, where bandwidth is
  shared by messages that cross the same port at once
  (:func:`~distlab.placement.cluster.edge_costs`). All groups of a dimension
  run at the same time; the slowest group sets the dimension's time.

Rings follow the GPUs' order in the cluster (as NCCL orders a ring by topology),
so a group that spans two nodes crosses the network twice per ring, not at every hop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distlab.sim.cost import closed_form

from .cluster import ROUTE_KINDS, edge_costs
from .jobs import Job, Workload

#: dimension -> the collective its calls use.
COLLECTIVES = {
    "tp": "all_reduce",
    "cp": "ring_p2p",
    "ep": "all_to_all",
    "pp": "p2p",
    "dp": "all_reduce",
}


@dataclass(frozen=True)
class Volume:
    """One dimension's traffic per step: ``calls`` collectives of ``n_bytes`` each (per rank)."""

    dimension: str
    collective: str
    n_bytes: float
    calls: int
    formula: str


def comm_volumes(job: Job, workload: Workload | None = None) -> list[Volume]:
    """Bytes per call and calls per step for each dimension of ``job`` whose degree is > 1.

    ``b`` micro-batch, ``s`` sequence, ``h`` hidden, ``L`` layers, ``m``
    micro-batches per step, ``B`` bytes per value, ``P`` parameters:

    * TP: ``4 L/pp m`` all-reduces of ``b s/cp h B`` (two in the forward and two
      in the backward pass of each layer: Shoeybi et al. 2019, "Megatron-LM",
      Section 3, operators f and g);
    * CP: ring attention passes K and V (``2 b s/cp h B``) around the ring
      ``cp - 1`` times per layer forward, and K, V plus their gradients backward:
      ``3 (cp-1) L/pp m`` messages (Liu et al. 2023, "Ring Attention with Blockwise
      Transformers");
    * EP: every layer an MoE layer with top-1 routing: ``4 L/pp m`` all-to-alls
      of ``b s/cp h B`` (dispatch and combine, forward and backward;
      Lepikhin et al. 2021, "GShard");
    * PP: ``2 m`` point-to-point messages of ``b s/cp h B`` per stage boundary
      (activation forward, its gradient backward: Narayanan et al. 2021, Section 4.1,
      without the scatter/gather optimisation);
    * DP: one all-reduce of the gradients, ``P / (tp pp) B`` bytes, over the
      ``dp x cp`` ranks that hold the same weights.

    Minimal adapter: ``distlab.calc.comm`` (issue 3) is to own these volumes;
    until it exposes them this is the only copy in the library.
    """
    w = workload or job.workload
    layers_per_stage = w.layers / job.pp
    activation = w.micro_batch * (w.seq_len / job.cp) * w.hidden * w.bytes_per_value
    m = w.micro_batches
    volumes = []
    if job.tp > 1:
        volumes.append(
            Volume(
                "tp",
                "all_reduce",
                activation,
                round(4 * layers_per_stage * m),
                "4 L/pp m x b s/cp h B",
            )
        )
    if job.cp > 1:
        calls = round(3 * (job.cp - 1) * layers_per_stage * m)
        volumes.append(
            Volume("cp", "ring_p2p", 2 * activation, calls, "3 (cp-1) L/pp m x 2 b s/cp h B")
        )
    if job.ep > 1:
        volumes.append(
            Volume(
                "ep",
                "all_to_all",
                activation,
                round(4 * layers_per_stage * m),
                "4 L/pp m x b s/cp h B",
            )
        )
    if job.pp > 1:
        volumes.append(Volume("pp", "p2p", activation, 2 * m, "2 m x b s/cp h B"))
    if job.dp * job.cp > 1:
        grads = w.params / (job.tp * job.pp) * w.bytes_per_value
        volumes.append(Volume("dp", "all_reduce", grads, 1, "1 x P/(tp pp) B over dp x cp ranks"))
    return volumes


@dataclass(frozen=True)
class DimensionCost:
    """One dimension's share of the score. Times in seconds, bandwidth in bytes/s."""

    dimension: str
    collective: str
    group_size: int
    n_groups: int
    n_bytes: float
    calls: int
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
        return {p.dimension: p.time_s for p in self.parts}

    def part(self, dimension: str) -> DimensionCost | None:
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
    if vol.collective in ("all_reduce", "all_to_all"):
        ring = np.sort(groups, axis=1)  # NCCL-like: ring in topology order
        src, dst = ring, np.roll(ring, -1, axis=1)
    elif vol.collective == "ring_p2p":
        src, dst = groups, np.roll(groups, -1, axis=1)  # ring attention follows rank order
    else:  # pipeline: stage i -> stage i + 1, all boundaries at once
        src, dst = groups[:, :-1], groups[:, 1:]
    costs = edge_costs(cluster, src.ravel(), dst.ravel())
    width = src.shape[1]
    alpha = costs.alpha.reshape(n_groups, width).max(axis=1)
    bandwidth = costs.bandwidth.reshape(n_groups, width).min(axis=1)
    if vol.collective in ("all_reduce", "all_to_all"):
        formula = closed_form(
            f"ring_{vol.collective}" if vol.collective == "all_reduce" else "all_to_all", n
        )
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
