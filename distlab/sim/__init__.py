"""The alpha-beta collective simulator: topologies, closed-form costs, schedule replay.

Pure Python (no torch), so it loads instantly::

    from distlab.sim import preset, simulate, build_schedule
    cluster = preset("dgx-h100", nodes=4)
    result = simulate(build_schedule("ring_all_reduce", 32), cluster, 1 << 30)
    result.time_s, result.busbw_GBps

Modules: :mod:`~distlab.sim.topology` (clusters, links, routes),
:mod:`~distlab.sim.cost` (closed forms), :mod:`~distlab.sim.bandwidth`
(algbw, busbw, lower bound), :mod:`~distlab.sim.replay` (schedule replay),
:mod:`~distlab.sim.crossover` (tree vs ring), :mod:`~distlab.sim.fit`
(alpha and beta from measured runs; uses numpy, imported on demand).
"""

from __future__ import annotations

from .algorithms import algorithm_name, algorithm_names, build_schedule, closed_form, predicted_cost
from .bandwidth import algbw, all_reduce_lower_bound, busbw, busbw_factor
from .cost import AlphaBetaCost, PhasedCost, hierarchical_all_reduce_cost
from .crossover import crossover_size
from .replay import SimResult, simulate
from .topology import (
    PRESETS,
    ClusterSpec,
    Link,
    Route,
    cluster_from_dict,
    load_cluster,
    preset,
    shared_bus,
    uniform_cluster,
)

__all__ = [
    "PRESETS",
    "AlphaBetaCost",
    "ClusterSpec",
    "Link",
    "PhasedCost",
    "Route",
    "SimResult",
    "algbw",
    "algorithm_name",
    "algorithm_names",
    "all_reduce_lower_bound",
    "build_schedule",
    "busbw",
    "busbw_factor",
    "closed_form",
    "cluster_from_dict",
    "crossover_size",
    "hierarchical_all_reduce_cost",
    "load_cluster",
    "predicted_cost",
    "preset",
    "shared_bus",
    "simulate",
    "uniform_cluster",
]
