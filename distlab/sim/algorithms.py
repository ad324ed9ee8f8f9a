"""The algorithms the simulator knows, read from the one registry.

An algorithm is named like the collective that runs it
(:data:`distlab.collectives.registry.REGISTRY`): ``"ring_all_reduce"``,
``"tree_broadcast"``, ``"all_to_all"``, ``"hierarchical_shard_all_reduce"``...
The CLI and the benchmark records name them by ``(algorithm, collective)``,
e.g. ``("ring", "all_reduce")``; :func:`algorithm_name` turns one into the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cost import AlphaBetaCost, PhasedCost, closed_form, hierarchical_all_reduce_cost
from .topology import ClusterSpec

if TYPE_CHECKING:  # pragma: no cover
    from distlab.collectives.registry import Algorithm
    from distlab.collectives.schedule import Schedule


def _registry() -> dict[str, Algorithm]:
    from distlab.collectives.registry import REGISTRY  # the registry imports distlab.sim.cost

    return REGISTRY


def algorithm_names() -> list[str]:
    """Every algorithm name :func:`build_schedule` accepts."""
    return sorted(_registry())


def algorithm_name(algorithm: str, collective: str) -> str:
    """``("ring", "all_reduce")`` -> ``"ring_all_reduce"``; all-to-all's only
    algorithm (``"pairwise"``) is plain ``"all_to_all"``."""
    from distlab.collectives.registry import lookup

    return lookup(algorithm, collective).name


def _entry(name: str) -> Algorithm:
    entry = _registry().get(name)
    if entry is None:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(algorithm_names())}")
    return entry


def build_schedule(name: str, n: int, *, ranks_per_node: int | None = None) -> Schedule:
    """The schedule of algorithm ``name`` on ``n`` ranks.

    The hierarchical all-reduces need ``ranks_per_node`` (ranks ``0..k-1`` on node 0, ...).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"number of ranks must be an integer >= 1, got {n!r}")
    return _entry(name).schedule(n, ranks_per_node=ranks_per_node)


def predicted_cost(name: str, n: int, cluster: ClusterSpec) -> AlphaBetaCost | PhasedCost:
    """The closed form of ``name`` on ``n`` ranks of ``cluster``.

    Hierarchical algorithms get a :class:`PhasedCost` over the cluster's intra
    and inter links; the others an :class:`AlphaBetaCost` (use it with one link).
    """
    entry = _entry(name)
    if not entry.two_level:
        return closed_form(name, n)
    k = min(cluster.gpus_per_node, n)
    if n % k:
        raise ValueError(f"{name}: {n} ranks do not fill nodes of {k} GPUs")
    return hierarchical_all_reduce_cost(
        n // k,
        k,
        cluster.intra,
        cluster.inter,
        variant=entry.options["variant"],
        nics_per_node=cluster.nics_per_node,
    )
