"""Collective algorithms written from scratch on ``torch.distributed`` send/recv.

Each algorithm is a :class:`~distlab.core.collective_schedule.CollectiveSchedule` (data:
which chunks move where, step by step) plus one shared executor. The public
functions mirror ``torch.distributed`` (tensor in place, ``op``, ``group``)
and are named ``<algorithm>_<collective>``.

Importing this package does not import torch: the schedule builders are
pure Python (the simulator uses them); torch is loaded when a collective runs.
The table that names every algorithm and joins its schedule, its closed-form
cost and its runner is :data:`distlab.sim.algorithms.REGISTRY`.
"""

from __future__ import annotations

from distlab.core.collective_schedule import CollectiveSchedule, Transfer, chunk_bounds
from distlab.core.renamed import old_names

from .all_to_all import all_to_all, all_to_all_schedule
from .halving_doubling import halving_doubling_all_reduce, halving_doubling_all_reduce_schedule
from .hierarchical import hierarchical_all_reduce, hierarchical_all_reduce_schedule
from .naive import naive_all_reduce, naive_all_reduce_schedule
from .ring import (
    ring_all_gather,
    ring_all_gather_schedule,
    ring_all_reduce,
    ring_all_reduce_schedule,
    ring_reduce_scatter,
    ring_reduce_scatter_schedule,
)
from .traffic import count_traffic
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

__all__ = [
    "CollectiveSchedule",
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


# the old name, which notebooks from older releases still import from here
__getattr__ = old_names(__name__, {"Schedule": CollectiveSchedule})
