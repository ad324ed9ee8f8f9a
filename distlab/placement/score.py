"""Score a placement: estimated communication seconds per training step.

For every parallel dimension the score multiplies

    calls per step x (time of one call on the links this placement gives that dimension)

and adds the dimensions up (no overlap with compute or with each other: an
upper bound that ranks placements, not a step-time prediction).

* **Volumes** (what each rank sends): :func:`dimension_volumes`, the calculator's
  own counts: :mod:`distlab.calc.comm` for TP, CP, PP and DP (ZeRO stages
  included), :mod:`distlab.calc.moe` for EP (capacity padding included).
* **Time of one call**: the part's messages and bytes sent per call, as
  :mod:`distlab.calc.volume` counts them (ring all-reduce ``2(n-1)`` messages and
  ``2(n-1)/n N`` bytes; ring reduce-scatter, all-gather and all-to-all ``n-1`` and
  ``(n-1)/n N``; a point-to-point message 1 and ``N``: the closed forms of
  :mod:`distlab.sim.cost`), priced ``messages x alpha + bytes / bandwidth`` on each
  group's **slowest link**: the largest latency and the smallest bandwidth among
  the messages of one round, where bandwidth is shared by messages that cross the
  same port at once (:func:`~distlab.placement.cluster.edge_costs`). All groups of
  a dimension run at the same time; the slowest group sets the dimension's time.

Rings follow the GPUs' order in the cluster (as NCCL orders a ring by topology),
so a group that spans two nodes crosses the network twice per ring, not at every hop.
Ring attention (CP) passes its blocks round the ring in rank order; a pipeline (PP)
sends from each stage to the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from distlab.calc import comm, moe
from distlab.calc.volume import CommVolume
from distlab.core.layout import Layout, check_layout

from .cluster import ROUTE_KINDS, edge_costs
from .jobs import Workload

#: Collectives priced as a ring in the GPUs' topology order.
RING_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")

#: The MoE layer the score assumes for EP (a :class:`Workload` has no MoE shape yet):
#: every layer an MoE layer with one expert per EP rank, top-1 routing (Switch
#: Transformer) and :func:`distlab.calc.moe.moe_all_to_all_comm`'s default capacity factor.
MOE_TOP_K = 1
MOE_CAPACITY_FACTOR = 1.25


def dimension_volumes(layout: Layout, workload: Workload | None = None) -> dict[str, CommVolume]:
    """The calculator's volume of each dimension of ``layout`` whose degree is > 1, keyed
    ``"tp"``, ``"cp"``, ``"ep"``, ``"pp"``, ``"dp"``, for the model ``workload`` (default:
    :class:`Workload`'s 7B-class GPT) run with the layout's micro-batch size, micro-batch
    count and ZeRO stage; parts of one collective and size are merged into one part
    (their counts added, their names joined).

    One pipeline stage holds ``ceil(L / pp)`` layers (the busiest stage sets the
    pace) and each context-parallel rank ``ceil(s / cp)`` tokens of the sequence.

    * TP: :func:`distlab.calc.comm.tensor_parallel_comm` (four all-reduces of
      ``b s h B`` per layer and micro-batch, six with full recomputation; Shoeybi et
      al. 2019, Section 3);
    * CP: :func:`distlab.calc.comm.context_parallel_comm` (ring attention's K/V blocks);
    * EP: :func:`distlab.calc.moe.moe_all_to_all_comm` (four all-to-alls of the
      padded ``E x C x h`` buffer per layer and micro-batch; :data:`MOE_TOP_K`,
      :data:`MOE_CAPACITY_FACTOR`, one expert per EP rank);
    * PP: :func:`distlab.calc.comm.pipeline_parallel_comm` (``b s h B / tp`` per
      micro-batch each way; Narayanan et al. 2021, Section 4.1);
    * DP: :func:`distlab.calc.comm.data_parallel_comm` over the ``dp x cp`` ranks
      that hold the same weights, with the layout's ZeRO stage.
    """
    layout = check_layout(layout)
    w = workload or Workload()
    layers = math.ceil(w.layers / layout.pp)
    tokens = math.ceil(w.seq_len / layout.cp)
    m = layout.micro_batches
    shape = {
        "seq_len": tokens,
        "micro_batch": layout.micro_batch,
        "hidden": w.hidden,
        "bytes_per_element": w.bytes_per_value,
    }
    volumes: dict[str, CommVolume] = {}
    if layout.tp > 1:
        volumes["tp"] = comm.tensor_parallel_comm(
            **shape, layers=layers, tp=layout.tp, micro_batches=m,
            sequence_parallel=layout.sequence_parallel, recompute=layout.recompute,
        )  # fmt: skip
    if layout.cp > 1:
        volumes["cp"] = comm.context_parallel_comm(
            **shape, layers=layers, cp=layout.cp, micro_batches=m
        )
    if layout.ep > 1:
        volumes["ep"] = moe.moe_all_to_all_comm(
            tokens=layout.micro_batch * tokens,
            hidden=w.hidden,
            num_experts=layout.ep,
            ep=layout.ep,
            top_k=MOE_TOP_K,
            capacity_factor=MOE_CAPACITY_FACTOR,
            moe_layers=layers,
            micro_batches=m,
            bytes_per_element=w.bytes_per_value,
        )
    if layout.pp > 1:
        volumes["pp"] = comm.pipeline_parallel_comm(
            **shape, micro_batches=m, pp=layout.pp, tp=layout.tp
        )
    if layout.dp * layout.cp > 1:
        volumes["dp"] = comm.data_parallel_comm(
            w.params / (layout.tp * layout.pp),
            dp=layout.dp * layout.cp,
            zero_stage=layout.zero_stage,
            bytes_per_param=w.bytes_per_value,
            bytes_per_grad=w.bytes_per_value,
            micro_batches=m,
        )
    return {name: _merged(volume) for name, volume in volumes.items()}


def _merged(volume: CommVolume) -> CommVolume:
    """``volume`` with the parts of one collective and payload merged (counts added)."""
    merged: dict[tuple[str, float], object] = {}
    for part in volume.parts:
        key = (part.collective, part.payload_bytes)
        old = merged.get(key)
        merged[key] = (
            part
            if old is None
            else replace(old, what=f"{old.what}; {part.what}", count=old.count + part.count)
        )
    return CommVolume(volume.name, tuple(merged.values()))


@dataclass(frozen=True)
class DimensionCost:
    """One dimension's share of the score. Times in seconds, bandwidth in bytes/s."""

    dimension: str
    collective: str
    group_size: int
    n_groups: int
    n_bytes: float  # payload of one call
    calls: float
    bytes_sent: float  # per rank per step, as distlab.calc counts it
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
    cluster, gpu_groups: dict[str, np.ndarray], layout: Layout, workload: Workload | None = None
) -> CommScore:
    """Score a placement given each dimension's groups as GPU ids (``(n_groups, size)`` arrays).

    ``gpu_groups`` needs the keys ``"tp"``, ``"cp"``, ``"ep"``, ``"pp"`` and ``"dp-cp"``.
    """
    parts = []
    for dimension, volume in dimension_volumes(layout, workload).items():
        groups = np.asarray(gpu_groups["dp-cp" if dimension == "dp" else dimension])
        parts += [_dimension_cost(cluster, dimension, part, groups) for part in volume.parts]
    return CommScore(tuple(parts))


def _dimension_cost(cluster, dimension: str, part, groups: np.ndarray) -> DimensionCost:
    """Price one calc part on the slowest link of each of ``groups``; the slowest group wins."""
    n_groups, n = groups.shape
    if part.collective in RING_COLLECTIVES and part.group_size != n:
        raise ValueError(
            f"{dimension} groups have {n} GPUs but its volume counts {part.group_size}"
        )
    if part.collective in RING_COLLECTIVES:
        ring = np.sort(groups, axis=1)  # NCCL-like: ring in topology order
        src, dst = ring, np.roll(ring, -1, axis=1)
    elif part.collective == "send_recv" and dimension == "cp":
        src, dst = groups, np.roll(groups, -1, axis=1)  # ring attention follows rank order
    elif part.collective == "send_recv":  # pipeline: stage i -> stage i + 1, all at once
        src, dst = groups[:, :-1], groups[:, 1:]
    else:
        raise ValueError(f"the score cannot price a {part.collective!r} of dimension {dimension!r}")
    costs = edge_costs(cluster, src.ravel(), dst.ravel())
    width = src.shape[1]
    alpha = costs.alpha.reshape(n_groups, width).max(axis=1)
    bandwidth = costs.bandwidth.reshape(n_groups, width).min(axis=1)
    # one call: calc's messages and bytes per call, messages x alpha + bytes / bandwidth
    per_group = (part.messages * alpha + part.bytes_sent / bandwidth) / part.count
    worst = int(np.argmax(per_group))
    n_bytes = part.payload_bytes
    edge_times = (costs.alpha + n_bytes / costs.bandwidth).reshape(n_groups, width)[worst]
    slowest_kind = ROUTE_KINDS[
        int(costs.kind.reshape(n_groups, width)[worst][np.argmax(edge_times)])
    ]
    return DimensionCost(
        dimension=dimension,
        collective=part.collective,
        group_size=n,
        n_groups=n_groups,
        n_bytes=n_bytes,
        calls=part.count,
        bytes_sent=part.bytes_sent,
        slowest_link=slowest_kind,
        alpha=float(alpha[worst]),
        bandwidth=float(bandwidth[worst]),
        time_per_call_s=float(per_group[worst]),
    )
