"""Put a job's ranks on GPUs: rank -> (node, GPU), checked, explained and scored.

In Megatron-style training the rank numbering *is* the placement: ranks fill
the nodes in order (torchrun gives node ``k`` ranks ``8k .. 8k+7``), and the
``order`` of the parallel dimensions (:mod:`distlab.core.ranks`) decides
which groups land inside a node. The hierarchical rules follow from how much
each dimension talks (Narayanan et al. 2021, Section 3.3; :func:`~distlab.placement.score.dimension_volumes`):

1. **TP innermost**, inside one node or NVLink domain: it all-reduces
   activations four times per layer per micro-batch;
2. **CP, then EP** next (EP stays in the node when ``tp * ep`` fits there);
3. **PP and DP** across nodes. The issue's rule puts DP outermost
   (``tp-cp-ep-pp-dp``); Megatron-core's default puts PP outermost
   (``tp-cp-ep-dp-pp``). With ``order=None`` :func:`place` scores both and keeps
   the cheaper, so the numbers, not a rule, decide.

Strategies: ``"hierarchical"`` (the rules above; TP groups never straddle a
node: nodes with a ragged number of free GPUs give only whole TP groups),
``"rank-order"`` (rank ``r`` on the ``r``-th GPU given, whatever the topology)
and ``"random"`` (a seeded shuffle). :func:`compare_placements` scores them side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from distlab.core.ranks import DEFAULT_ORDER, grid_groups, parse_order
from distlab.sim.topology import ClusterSpec

from .cluster import ROUTE_KINDS, edge_costs, nvlink_group_limit, resolve_cluster
from .jobs import Job, Workload
from .score import CommScore, score_groups

STRATEGIES = ("hierarchical", "rank-order", "random")
#: Orders :func:`place` tries when the job does not fix one: DP outermost first (the issue's rule).
HIERARCHICAL_ORDERS = ("tp-cp-ep-pp-dp", DEFAULT_ORDER)
#: The deliberately bad layout :func:`compare_placements` shows: TP varies slowest.
TP_OUTERMOST_ORDER = "pp-dp-ep-cp-tp"


@dataclass(frozen=True, eq=False)
class Placement:
    """Where each rank of ``job`` runs: ``gpu_of_rank[r]`` is a global GPU id of ``cluster``."""

    job: Job
    cluster: ClusterSpec
    order: str
    strategy: str
    gpu_of_rank: np.ndarray

    # -- where ranks are -------------------------------------------------------------
    def location(self, rank: int) -> tuple[int, int]:
        """``(node, GPU index inside the node)`` of ``rank``."""
        gpu = int(self.gpu_of_rank[rank])
        return divmod(gpu, self.cluster.gpus_per_node)

    def locations(self) -> list[tuple[int, int]]:
        """``(node, local GPU)`` for every rank, in rank order."""
        nodes, local = np.divmod(self.gpu_of_rank, self.cluster.gpus_per_node)
        return list(zip(nodes.tolist(), local.tolist(), strict=True))

    def nodes_used(self) -> list[int]:
        return np.unique(self.gpu_of_rank // self.cluster.gpus_per_node).tolist()

    # -- groups -------------------------------------------------------------------
    def groups(self) -> dict[str, list[list[int]]]:
        """The job's process groups as ranks (see :func:`~distlab.placement.rank_groups`)."""
        return {key: grid.tolist() for key, grid in self._rank_grids.items()}

    def gpu_groups(self, dimension: str) -> np.ndarray:
        """The groups of ``dimension`` as GPU ids, shape ``(n_groups, group size)``."""
        if dimension not in self._rank_grids:
            raise ValueError(
                f"unknown dimension {dimension!r}; allowed: {sorted(self._rank_grids)}"
            )
        return self.gpu_of_rank[self._rank_grids[dimension]]

    @cached_property
    def _rank_grids(self) -> dict[str, np.ndarray]:
        return rank_grids(self.job, self.order)

    # -- checks, score, words ------------------------------------------------------------
    def violations(self) -> list[str]:
        """Broken placement rules, in words (empty when TP and, where it fits, EP stay local)."""
        problems = []
        limit = nvlink_group_limit(self.cluster)
        g = self.cluster.gpus_per_node
        container = g if self.job.tp <= g else limit
        tp = self.gpu_groups("tp") // container
        split = int((tp != tp[:, :1]).any(axis=1).sum())
        if split:
            where = "node" if container == g else "NVLink domain"
            problems.append(
                f"{split} of {len(tp)} TP groups span more than one {where}: their all-reduces "
                f"leave NVLink"
            )
        if self.job.ep > 1 and self.job.tp * self.job.ep <= g:
            ep = self.gpu_groups("ep") // g
            split = int((ep != ep[:, :1]).any(axis=1).sum())
            if split:
                problems.append(
                    f"{split} of {len(ep)} EP groups span nodes although tp*ep fits in one"
                )
        return problems

    def score(self, workload: Workload | None = None) -> CommScore:
        """Estimated communication seconds per step (see :mod:`distlab.placement.score`)."""
        grids = {key: self.gpu_of_rank[grid] for key, grid in self._rank_grids.items()}
        return score_groups(self.cluster, grids, self.job, workload)

    def link_summary(self) -> dict[str, dict[str, int]]:
        """Per dimension, how many of its groups have their slowest hop on each route kind."""
        summary = {}
        for dim in ("tp", "cp", "ep", "pp", "dp-cp"):
            groups = np.sort(self.gpu_groups(dim), axis=1)
            if groups.shape[1] < 2:
                continue
            src, dst = groups, np.roll(groups, -1, axis=1)
            kinds = edge_costs(self.cluster, src.ravel(), dst.ravel()).kind.reshape(src.shape)
            worst = _slowest_kind(kinds)
            names, counts = np.unique(worst, return_counts=True)
            summary[dim] = {ROUTE_KINDS[k]: int(c) for k, c in zip(names, counts, strict=True)}
        return summary

    def explain(self, workload: Workload | None = None) -> str:
        """What went where, which links each dimension uses, what broke, and the score."""
        job, c = self.job, self.cluster
        head = (
            f"{job.name}: {job.shape()} = {job.world_size} GPUs on {c.name} "
            f"({c.nodes} nodes x {c.gpus_per_node} GPUs; NVLink group limit {nvlink_group_limit(c)})"
        )
        how = (
            f"strategy {self.strategy}, rank order {self.order} (first name varies fastest), "
            f"{len(self.nodes_used())} nodes used"
        )
        lines = [head, how]
        for dim, kinds in self.link_summary().items():
            size = self.gpu_groups(dim).shape[1]
            where = ", ".join(f"{n} over {k}" for k, n in kinds.items())
            lines.append(f"  {dim.upper():6s} groups of {size}: slowest hop {where}")
        problems = self.violations()
        lines += [f"  PROBLEM: {p}" for p in problems] or ["  rules kept: every TP group on NVLink"]
        score = self.score(workload)
        lines.append(f"  estimated communication per step: {score.total * 1e3:.2f} ms")
        for part in score.parts:
            lines.append(
                f"    {part.dimension.upper():3s} {part.calls:5.0f} x {part.collective} of "
                f"{part.n_bytes / 1e6:.1f} MB on {part.slowest_link} "
                f"({part.bandwidth / 1e9:.1f} GB/s): {part.time_s * 1e3:.2f} ms"
            )
        return "\n".join(lines)


def rank_grids(job: Job, order: str) -> dict[str, np.ndarray]:
    """:func:`~distlab.placement.rank_groups` as integer arrays (the fast path for big jobs)."""
    names = parse_order(order)
    dense = {"tp": job.tp, "cp": job.cp, "ep": 1, "dp": job.dp, "pp": job.pp}
    expert = {"tp": job.tp, "cp": 1, "ep": job.ep, "dp": job.cp * job.dp // job.ep, "pp": job.pp}
    grids = {dim: grid_groups(names, dense, [dim]) for dim in ("tp", "cp", "dp", "pp")}
    grids["dp-cp"] = grid_groups(names, dense, ["dp", "cp"])
    grids["ep"] = grid_groups(names, expert, ["ep"])
    grids["expert_dp"] = grid_groups(names, expert, ["dp"])
    return grids


def place(
    job: Job,
    cluster: ClusterSpec | str | dict,
    *,
    gpus: list[int] | np.ndarray | None = None,
    strategy: str = "hierarchical",
    seed: int = 0,
    workload: Workload | None = None,
) -> Placement:
    """Map every rank of ``job`` to a GPU of ``cluster`` (optionally only among ``gpus``).

    Raises ``ValueError`` when the job needs more GPUs than it is given, when
    TP is larger than a node / NVLink domain, or (``"hierarchical"``) when the
    job's ``order`` puts another dimension inside TP. ``"rank-order"`` and
    ``"random"`` place anything that fits and say what broke in
    :meth:`Placement.explain`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; allowed: {STRATEGIES}")
    cluster = resolve_cluster(cluster)
    available = _available(cluster, gpus)
    _check_fits(job, cluster, len(available))
    if strategy == "rank-order":
        return Placement(job, cluster, job.rank_order, strategy, available[: job.world_size].copy())
    if strategy == "random":
        chosen = np.random.default_rng(seed).permutation(available)[: job.world_size]
        return Placement(job, cluster, job.rank_order, strategy, chosen)
    slots = whole_tp_slots(cluster, np.sort(available), job.tp)
    if len(slots) < job.world_size:
        raise ValueError(
            f"job {job.name!r} needs {job.world_size} GPUs in whole TP groups of {job.tp}, but only "
            f"{len(slots)} of the {len(available)} GPUs given can hold whole groups "
            f"(nodes with a free GPU count that is not a multiple of tp={job.tp} leave some over)"
        )
    slots = slots[: job.world_size]
    if job.order is not None:
        _check_tp_innermost(job)
        return Placement(job, cluster, job.order, strategy, slots)
    candidates = [Placement(job, cluster, order, strategy, slots) for order in HIERARCHICAL_ORDERS]
    totals = [p.score(workload).total for p in candidates]
    return candidates[int(np.argmin(totals))]


def whole_tp_slots(cluster: ClusterSpec, gpus: np.ndarray, tp: int) -> np.ndarray:
    """The GPUs of ``gpus`` (sorted) that can hold whole TP groups, in topology order.

    A TP group must sit in one node (``tp <= gpus_per_node``) or, on a
    multi-node NVLink domain, in one domain: each node (domain) contributes
    ``floor(free / tp) * tp`` of its free GPUs; consecutive blocks of ``tp``
    slots are then one group.
    """
    g = cluster.gpus_per_node
    container = g if tp <= g else g * cluster.nvlink_domain_nodes
    box = gpus // container
    starts = np.searchsorted(box, box, side="left")
    position = np.arange(len(gpus)) - starts
    counts = np.bincount(box, minlength=int(box.max()) + 1 if len(box) else 0)
    usable = (counts // tp) * tp
    return gpus[position < usable[box]]


def compare_placements(
    job: Job,
    cluster: ClusterSpec | str | dict,
    *,
    gpus: list[int] | np.ndarray | None = None,
    seed: int = 0,
    workload: Workload | None = None,
) -> list[tuple[str, Placement, CommScore]]:
    """Score the same job placed four ways: hierarchical, rank order (Megatron's default
    order on the GPUs as given), TP outermost, and random. Returns ``(label, placement, score)``."""
    cluster = resolve_cluster(cluster)
    base = Job(**{**job.__dict__, "order": None})
    rows = [("hierarchical", place(base, cluster, gpus=gpus, workload=workload))]
    megatron = Job(**{**job.__dict__, "order": DEFAULT_ORDER})
    rows.append(("rank order", place(megatron, cluster, gpus=gpus, strategy="rank-order")))
    bad = Job(**{**job.__dict__, "order": TP_OUTERMOST_ORDER})
    rows.append(("TP outermost", place(bad, cluster, gpus=gpus, strategy="rank-order")))
    rows.append(("random", place(megatron, cluster, gpus=gpus, strategy="random", seed=seed)))
    return [(label, p, p.score(workload)) for label, p in rows]


def _available(cluster: ClusterSpec, gpus) -> np.ndarray:
    if gpus is None:
        return np.arange(cluster.world_size)
    arr = np.asarray(list(gpus) if not isinstance(gpus, np.ndarray) else gpus, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError("gpus must be a flat list of GPU ids")
    if arr.size and (arr.min() < 0 or arr.max() >= cluster.world_size):
        raise ValueError(
            f"gpus must be in 0..{cluster.world_size - 1} for cluster {cluster.name!r}"
        )
    if len(np.unique(arr)) != len(arr):
        raise ValueError("gpus lists a GPU twice")
    return arr


def _check_fits(job: Job, cluster: ClusterSpec, n_available: int) -> None:
    if job.world_size > cluster.world_size:
        raise ValueError(
            f"job {job.name!r} needs {job.world_size} GPUs ({job.shape()}) but cluster "
            f"{cluster.name!r} has {cluster.world_size} ({cluster.nodes} nodes x {cluster.gpus_per_node})"
        )
    if job.world_size > n_available:
        raise ValueError(
            f"job {job.name!r} needs {job.world_size} GPUs but only {n_available} were given"
        )
    limit = nvlink_group_limit(cluster)
    if job.tp > limit:
        raise ValueError(
            f"job {job.name!r}: tp={job.tp} is larger than the {limit} GPUs of one "
            f"{'NVLink domain' if cluster.intra_kind == 'switch' else 'node'} of {cluster.name!r}; "
            f"a TP group must stay on NVLink (allowed: tp <= {limit})"
        )
    g = cluster.gpus_per_node
    if job.tp > g and job.tp % g:
        raise ValueError(
            f"job {job.name!r}: tp={job.tp} spans nodes of an NVLink domain, so it must be a "
            f"multiple of gpus_per_node={g}"
        )


def _check_tp_innermost(job: Job) -> None:
    names = parse_order(job.order)
    inside = [n for n in names[: names.index("tp")] if job.degrees()[n] > 1]
    if inside:
        raise ValueError(
            f"job {job.name!r}: order {job.order!r} puts {inside} inside TP, so TP groups would "
            f"straddle nodes; hierarchical placement needs tp first (use strategy='rank-order' "
            f"to measure what that costs)"
        )


def _slowest_kind(kinds: np.ndarray) -> np.ndarray:
    """Per row, the slowest route kind (network > pcie-far > bus > pcie > nvlink > local)."""
    rank = {k: i for i, k in enumerate(("local", "nvlink", "pcie", "bus", "pcie-far", "network"))}
    to_rank = np.array([rank[k] for k in ROUTE_KINDS])
    from_rank = np.argsort(to_rank)
    return from_rank[to_rank[kinds].max(axis=1)]
