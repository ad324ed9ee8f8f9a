"""Collective algorithms written from scratch on ``torch.distributed`` send/recv.

Each algorithm is a :class:`~distlab.collectives.schedule.Schedule` (data:
which chunks move where, step by step) plus one shared executor. The public
functions mirror ``torch.distributed`` (tensor in place, ``op``, ``group``)
and are named ``<algorithm>_<collective>``.

Importing this package does not import torch: the schedule builders are
pure Python (the simulator uses them); torch is loaded when a collective runs.
"""

from __future__ import annotations

from .all_to_all import all_to_all, all_to_all_schedule
from .halving_doubling import halving_doubling_all_reduce, halving_doubling_all_reduce_schedule
from .hierarchical import hierarchical_all_reduce, hierarchical_all_reduce_schedule
from .naive import naive_all_reduce, naive_all_reduce_schedule
from .registry import REGISTRY, Algorithm, lookup
from .ring import (
    ring_all_gather,
    ring_all_gather_schedule,
    ring_all_reduce,
    ring_all_reduce_schedule,
    ring_reduce_scatter,
    ring_reduce_scatter_schedule,
)
from .schedule import Schedule, Transfer, chunk_bounds
from .tree import (
    double_binary_tree_all_reduce,
    double_binary_tree_all_reduce_schedule,
    tree_all_reduce,
    tree_all_reduce_schedule,
    tree_broadcast,
    tree_broadcast_schedule,
    tree_reduce,
    tree_reduce_schedule,
)

#: Public collective name -> schedule builder (world_size, ...) -> Schedule; read from
#: :data:`~distlab.collectives.registry.REGISTRY` (the shard variant of the hierarchical
#: all-reduce is ``SCHEDULES["hierarchical_all_reduce"](n, k, "shard")``).
SCHEDULES = {a.name: a.builder for a in REGISTRY.values() if not a.options}
SCHEDULES["hierarchical_all_reduce"] = hierarchical_all_reduce_schedule

#: The one-level all-reduce algorithms, by short name (used by DDP and the tests).
ALL_REDUCE = {
    a.short: globals()[a.runner_name]
    for a in REGISTRY.values()
    if a.collective == "all_reduce" and not a.two_level
}

__all__ = [
    "ALL_REDUCE",
    "REGISTRY",
    "SCHEDULES",
    "Algorithm",
    "Schedule",
    "Transfer",
    "all_to_all",
    "all_to_all_schedule",
    "chunk_bounds",
    "count_traffic",
    "double_binary_tree_all_reduce",
    "double_binary_tree_all_reduce_schedule",
    "halving_doubling_all_reduce",
    "halving_doubling_all_reduce_schedule",
    "hierarchical_all_reduce",
    "hierarchical_all_reduce_schedule",
    "lookup",
    "naive_all_reduce",
    "naive_all_reduce_schedule",
    "ring_all_gather",
    "ring_all_gather_schedule",
    "ring_all_reduce",
    "ring_all_reduce_schedule",
    "ring_reduce_scatter",
    "ring_reduce_scatter_schedule",
    "tree_all_reduce",
    "tree_all_reduce_schedule",
    "tree_broadcast",
    "tree_broadcast_schedule",
    "tree_reduce",
    "tree_reduce_schedule",
]


def count_traffic():
    """Context manager counting the bytes this rank sends (see executor.count_traffic)."""
    from .executor import count_traffic as _count

    return _count()
