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
   (``tp-cp-ep-dp-pp``). :func:`place` scores both and keeps the cheaper, so the
   numbers, not a rule, decide.

What is placed is a :class:`~distlab.core.layout.Layout` (bare, or inside a
:class:`~distlab.placement.jobs.Job`), and the layout's ``order`` is the rank
order. The hierarchical placer *chooses* the order by default
(``choose_order=True``): the layout's own order is then ignored, and the
:class:`Placement` holds the job with the chosen order
(``placement.layout.order``), ready to hand to the runner. ``choose_order=False``
keeps the layout's order; ``"rank-order"`` and ``"random"`` always keep it.

Strategies: ``"hierarchical"`` (the rules above; TP groups never straddle a
node: nodes with a ragged number of free GPUs give only whole TP groups; on a busy
cluster it scores a few choices of GPUs, :func:`slot_choices` (the first in topology
order; whole TP, DP or PP groups per node, nodes in order or fullest first), and keeps
the cheapest: on small busy clusters it matches a search of every arrangement),
``"rank-order"`` (rank ``r`` on the ``r``-th GPU given, whatever the topology)
and ``"random"`` (a seeded shuffle). :func:`compare_placements` scores them side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from distlab.core.layout import Layout
from distlab.core.ranks import DEFAULT_ORDER, grid_groups, parse_order
from distlab.sim.topology import ClusterSpec

from .cluster import ROUTE_KINDS, edge_costs, nvlink_group_limit, resolve_cluster
from .jobs import Job, Workload, as_job
from .score import CommScore, score_groups

STRATEGIES = ("hierarchical", "rank-order", "random")
#: Orders :func:`place` tries when it chooses the order: DP outermost first (the issue's rule).
HIERARCHICAL_ORDERS = ("tp-cp-ep-pp-dp", DEFAULT_ORDER)
#: The deliberately bad layout :func:`compare_placements` shows: TP varies slowest.
TP_OUTERMOST_ORDER = "pp-dp-ep-cp-tp"


@dataclass(frozen=True, eq=False)
class Placement:
    """Where each rank of ``job`` runs: ``gpu_of_rank[r]`` is a global GPU id of ``cluster``,
    ranks numbered in ``job.layout.order``."""

    job: Job
    cluster: ClusterSpec
    strategy: str
    gpu_of_rank: np.ndarray

    @property
    def layout(self) -> Layout:
        """The job's layout, with the rank order this placement uses."""
        return self.job.layout

    @property
    def order(self) -> str:
        """The rank order (first name varies fastest): ``layout.order``."""
        return self.job.layout.order

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
        return rank_grids(self.job.layout)

    # -- checks, score, words ------------------------------------------------------------
    def violations(self) -> list[str]:
        """Broken placement rules, in words (empty when TP and, where it fits, EP stay local)."""
        problems = []
        limit = nvlink_group_limit(self.cluster)
        g = self.cluster.gpus_per_node
        layout = self.job.layout
        container = g if layout.tp <= g else limit
        tp = self.gpu_groups("tp") // container
        split = int((tp != tp[:, :1]).any(axis=1).sum())
        if split:
            where = "node" if container == g else "NVLink domain"
            problems.append(
                f"{split} of {len(tp)} TP groups span more than one {where}: their all-reduces "
                f"leave NVLink"
            )
        if layout.ep > 1 and layout.tp * layout.ep <= g:
            ep = self.gpu_groups("ep") // g
            split = int((ep != ep[:, :1]).any(axis=1).sum())
            if split:
                problems.append(
                    f"{split} of {len(ep)} EP groups span nodes although tp*ep fits in one"
                )
        return problems

    def score(self, workload: Workload | None = None) -> CommScore:
        """Estimated communication seconds per step (see :mod:`distlab.placement.score`) of the
        job's workload, or of ``workload`` if given."""
        grids = {key: self.gpu_of_rank[grid] for key, grid in self._rank_grids.items()}
        return score_groups(self.cluster, grids, self.job.layout, workload or self.job.workload)

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
            f"{job.name}: {job.layout.label()} = {job.layout.world_size} GPUs on {c.name} "
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


def rank_grids(layout: Layout) -> dict[str, np.ndarray]:
    """:func:`~distlab.placement.rank_groups` of ``layout`` (in its order) as integer arrays
    (the fast path for big jobs)."""
    names = parse_order(layout.order)
    t, c, e, d, p = layout.tp, layout.cp, layout.ep, layout.dp, layout.pp
    dense = {"tp": t, "cp": c, "ep": 1, "dp": d, "pp": p}
    expert = {"tp": t, "cp": 1, "ep": e, "dp": c * d // e, "pp": p}
    grids = {dim: grid_groups(names, dense, [dim]) for dim in ("tp", "cp", "dp", "pp")}
    grids["dp-cp"] = grid_groups(names, dense, ["dp", "cp"])
    grids["ep"] = grid_groups(names, expert, ["ep"])
    grids["expert_dp"] = grid_groups(names, expert, ["dp"])
    return grids


def place(
    job: Job | Layout,
    cluster: ClusterSpec | str | dict,
    *,
    gpus: list[int] | np.ndarray | None = None,
    strategy: str = "hierarchical",
    choose_order: bool = True,
    seed: int = 0,
    workload: Workload | None = None,
) -> Placement:
    """Map every rank of ``job`` (a :class:`Job`, or a bare :class:`~distlab.core.layout.Layout`)
    to a GPU of ``cluster`` (optionally only among ``gpus``).

    ``"hierarchical"`` with ``choose_order=True`` scores the orders of
    :data:`HIERARCHICAL_ORDERS` on each choice of GPUs of :func:`slot_choices` for
    ``workload`` (default: the job's) and keeps the cheapest: the returned placement's
    ``layout.order`` is the one chosen. With
    ``choose_order=False``, and for ``"rank-order"`` and ``"random"``, the layout's
    own order numbers the ranks.

    Raises ``ValueError`` when the job needs more GPUs than it is given, when
    TP is larger than a node / NVLink domain, or (``"hierarchical"``) when the
    layout's order, kept, puts another dimension inside TP. ``"rank-order"`` and
    ``"random"`` place anything that fits and say what broke in
    :meth:`Placement.explain`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; allowed: {STRATEGIES}")
    job = as_job(job)
    layout = job.layout
    cluster = resolve_cluster(cluster)
    available = _available(cluster, gpus)
    _check_fits(job, cluster, len(available))
    world = layout.world_size
    if strategy == "rank-order":
        return Placement(job, cluster, strategy, available[:world].copy())
    if strategy == "random":
        chosen = np.random.default_rng(seed).permutation(available)[:world]
        return Placement(job, cluster, strategy, chosen)
    slots = whole_tp_slots(cluster, np.sort(available), layout.tp)
    if len(slots) < world:
        raise ValueError(
            f"job {job.name!r} needs {world} GPUs in whole TP groups of {layout.tp}, but only "
            f"{len(slots)} of the {len(available)} GPUs given can hold whole groups "
            f"(nodes with a free GPU count that is not a multiple of tp={layout.tp} leave some over)"
        )
    if not choose_order:
        _check_tp_innermost(job)
    orders = HIERARCHICAL_ORDERS if choose_order else (layout.order,)
    candidates = [
        Placement(with_order(job, order), cluster, strategy, chosen)
        for chosen in slot_choices(cluster, slots, layout)
        for order in orders
    ]
    totals = [p.score(workload).total for p in candidates]
    return candidates[int(np.argmin(totals))]  # the first of equals: topology order


def slot_choices(cluster: ClusterSpec, slots: np.ndarray, layout: Layout) -> list[np.ndarray]:
    """The sets of ``layout.world_size`` GPUs a hierarchical placement tries, taken from
    ``slots`` (whole TP groups, in topology order), each in topology order.

    Each node (NVLink domain when TP spans nodes) gives whole *units* of consecutive ranks:
    a TP group (TP x CP), or a whole DP or PP group of them, so that the group stays inside
    the node; the nodes are taken in topology order, or fullest first, so that a job fills
    free nodes instead of spreading over partly busy ones and sending its DP or PP groups
    over the network."""
    g, world = cluster.gpus_per_node, layout.world_size
    box = slots // (g if layout.tp <= g else g * cluster.nvlink_domain_nodes)
    per_box = np.split(slots, np.flatnonzero(box[1:] != box[:-1]) + 1) if len(slots) else []
    inner = layout.tp * layout.cp
    choices = [slots[:world]]
    for unit in sorted({inner, inner * layout.dp, inner * layout.pp}):
        whole = [gpus[: len(gpus) // unit * unit] for gpus in per_box]
        sizes = np.array([len(gpus) for gpus in whole])
        fullest = np.lexsort((np.arange(len(whole)), -sizes))  # most first, then topology order
        for order in (range(len(whole)), fullest):
            filled = np.concatenate([whole[i] for i in order] or [slots[:0]])[:world]
            if len(filled) == world:
                choices.append(np.sort(filled))
    return [c for i, c in enumerate(choices) if not any(np.array_equal(c, d) for d in choices[:i])]


def with_order(job: Job, order: str) -> Job:
    """``job`` with its layout's rank order set to ``order``."""
    return replace(job, layout=job.layout.with_(order=order))


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
    job: Job | Layout,
    cluster: ClusterSpec | str | dict,
    *,
    gpus: list[int] | np.ndarray | None = None,
    seed: int = 0,
    workload: Workload | None = None,
) -> list[tuple[str, Placement, CommScore]]:
    """Score the same job placed four ways: hierarchical (order chosen), rank order
    (Megatron's default order on the GPUs as given), TP outermost, and random (Megatron's
    order). Returns ``(label, placement, score)``; the layout's own order is not used."""
    job = as_job(job)
    cluster = resolve_cluster(cluster)
    megatron = with_order(job, DEFAULT_ORDER)
    rows = [
        ("hierarchical", place(job, cluster, gpus=gpus, workload=workload)),
        ("rank order", place(megatron, cluster, gpus=gpus, strategy="rank-order")),
        ("TP outermost", place(with_order(job, TP_OUTERMOST_ORDER), cluster, gpus=gpus,
                               strategy="rank-order")),
        ("random", place(megatron, cluster, gpus=gpus, strategy="random", seed=seed)),
    ]  # fmt: skip
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
    layout = job.layout
    if layout.world_size > cluster.world_size:
        raise ValueError(
            f"job {job.name!r} needs {layout.world_size} GPUs ({layout.label()}) but cluster "
            f"{cluster.name!r} has {cluster.world_size} ({cluster.nodes} nodes x {cluster.gpus_per_node})"
        )
    if layout.world_size > n_available:
        raise ValueError(
            f"job {job.name!r} needs {layout.world_size} GPUs but only {n_available} were given"
        )
    limit = nvlink_group_limit(cluster)
    if layout.tp > limit:
        raise ValueError(
            f"job {job.name!r}: tp={layout.tp} is larger than the {limit} GPUs of one "
            f"{'NVLink domain' if cluster.intra_kind == 'switch' else 'node'} of {cluster.name!r}; "
            f"a TP group must stay on NVLink (allowed: tp <= {limit})"
        )
    g = cluster.gpus_per_node
    if layout.tp > g and layout.tp % g:
        raise ValueError(
            f"job {job.name!r}: tp={layout.tp} spans nodes of an NVLink domain, so it must be a "
            f"multiple of gpus_per_node={g}"
        )


def _check_tp_innermost(job: Job) -> None:
    names = parse_order(job.layout.order)
    inside = [n for n in names[: names.index("tp")] if getattr(job.layout, n) > 1]
    if inside:
        raise ValueError(
            f"job {job.name!r}: order {job.layout.order!r} puts {inside} inside TP, so TP groups would "
            f"straddle nodes; hierarchical placement needs tp first (use strategy='rank-order' "
            f"to measure what that costs)"
        )


def _slowest_kind(kinds: np.ndarray) -> np.ndarray:
    """Per row, the slowest route kind (network > pcie-far > bus > pcie > nvlink > local)."""
    rank = {k: i for i, k in enumerate(("local", "nvlink", "pcie", "bus", "pcie-far", "network"))}
    to_rank = np.array([rank[k] for k in ROUTE_KINDS])
    from_rank = np.argsort(to_rank)
    return from_rank[to_rank[kinds].max(axis=1)]
