"""The algorithms the simulator knows: names, schedules and closed forms in one place.

An algorithm is named like the collective that runs it
(``distlab.collectives.SCHEDULES``): ``"ring_all_reduce"``, ``"tree_broadcast"``,
``"all_to_all"``... plus ``"hierarchical_shard_all_reduce"`` for the shard
variant of the hierarchical all-reduce. The CLI and the benchmark records
name them by ``(algorithm, collective)``, e.g. ``("ring", "all_reduce")``;
:func:`algorithm_name` turns one into the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cost import CLOSED_FORMS, AlphaBetaCost, PhasedCost, closed_form, hierarchical_all_reduce_cost
from .topology import ClusterSpec

if TYPE_CHECKING:  # pragma: no cover
    from distlab.collectives.schedule import Schedule

HIERARCHICAL = ("hierarchical_all_reduce", "hierarchical_shard_all_reduce")


def algorithm_names() -> list[str]:
    """Every algorithm name :func:`build_schedule` accepts."""
    from distlab.collectives import SCHEDULES

    return sorted({*SCHEDULES, *HIERARCHICAL})


def algorithm_name(algorithm: str, collective: str) -> str:
    """``("ring", "all_reduce")`` -> ``"ring_all_reduce"``; all-to-all's only
    algorithm (``"pairwise"``) is plain ``"all_to_all"``."""
    name = "all_to_all" if collective == "all_to_all" else f"{algorithm}_{collective}"
    if name not in algorithm_names():
        known = ", ".join(algorithm_names())
        raise ValueError(
            f"no algorithm {algorithm!r} for collective {collective!r}; known: {known}"
        )
    return name


def build_schedule(name: str, n: int, *, ranks_per_node: int | None = None) -> Schedule:
    """The schedule of algorithm ``name`` on ``n`` ranks.

    The hierarchical all-reduces need ``ranks_per_node`` (ranks ``0..k-1`` on node 0, ...).
    """
    from distlab.collectives import SCHEDULES

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"number of ranks must be an integer >= 1, got {n!r}")
    if name in HIERARCHICAL:
        if ranks_per_node is None:
            raise ValueError(f"{name} needs ranks_per_node (GPUs per node)")
        variant = "shard" if name == "hierarchical_shard_all_reduce" else "leader"
        return SCHEDULES["hierarchical_all_reduce"](n, ranks_per_node, variant)
    if name not in SCHEDULES:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(algorithm_names())}")
    return SCHEDULES[name](n)


def predicted_cost(name: str, n: int, cluster: ClusterSpec) -> AlphaBetaCost | PhasedCost:
    """The closed form of ``name`` on ``n`` ranks of ``cluster``.

    Hierarchical algorithms get a :class:`PhasedCost` over the cluster's intra
    and inter links; the others an :class:`AlphaBetaCost` (use it with one link).
    """
    if name in HIERARCHICAL:
        k = min(cluster.gpus_per_node, n)
        if n % k:
            raise ValueError(f"{name}: {n} ranks do not fill nodes of {k} GPUs")
        variant = "shard" if name == "hierarchical_shard_all_reduce" else "leader"
        return hierarchical_all_reduce_cost(
            n // k,
            k,
            cluster.intra,
            cluster.inter,
            variant=variant,
            nics_per_node=cluster.nics_per_node,
        )
    if name not in CLOSED_FORMS:
        raise ValueError(
            f"no closed form for {name!r}; known: {sorted({*CLOSED_FORMS, *HIERARCHICAL})}"
        )
    return closed_form(name, n)
