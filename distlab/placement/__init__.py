"""Placement: put parallel jobs on GPU clusters, one by hand or many with a scheduler.

* :func:`rank_groups`: the process groups of a tp x cp x dp x pp (x ep) job, Megatron-core's convention;
* :func:`place`, :class:`Placement`: a :class:`~distlab.core.layout.Layout` (bare, or in a
  :class:`Job` with a name, a model :class:`Workload` and scheduling fields) put on GPUs:
  rank -> (node, GPU), checked, explained and scored, the rank order chosen by score unless
  kept (:func:`dimension_volumes`: what each dimension sends, from :mod:`distlab.calc`);
* :func:`compare_placements`: hierarchical vs rank order vs TP outermost vs random.

Pure Python plus numpy; no torch.
"""

from __future__ import annotations

from distlab.core.ranks import DEFAULT_ORDER, rank_groups

from .cluster import nvlink_group_limit, resolve_cluster
from .jobs import Job, Workload
from .placer import STRATEGIES, Placement, compare_placements, place
from .score import CommScore, DimensionCost, dimension_volumes

__all__ = [
    "DEFAULT_ORDER",
    "STRATEGIES",
    "CommScore",
    "DimensionCost",
    "Job",
    "Placement",
    "Workload",
    "compare_placements",
    "dimension_volumes",
    "nvlink_group_limit",
    "place",
    "rank_groups",
    "resolve_cluster",
]
