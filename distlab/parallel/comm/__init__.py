"""How ranks talk: the family every other family of :mod:`distlab.parallel` builds on.

Read in this order:

================  ================================================================
``collectives``   :class:`Collectives` (distlab's ring/tree or torch's built-in, on one
                  process group, traffic counted) and :class:`CommThread`, the thread a
                  wrapper launches its collectives on so backward can go on meanwhile
``buckets``       gradient buckets (PyTorch DDP's 25 MiB), and knowing during backward
                  when a bucket's gradients are all ready (DDP, ZeRO and FSDP use it)
``agreement``     :func:`check_same_across_ranks`: every rank got the same arguments, or
                  every rank raises the same ``ValueError`` naming what differs
``trace``         :func:`trace_comm`: every collective and message of a step, by group
================  ================================================================

Nothing here knows a model: the families above (``data``, ``zero``, ``tensor``,
``context``, ``pipeline``, ``moe``) call these to move tensors.
"""

from __future__ import annotations

from .agreement import check_same_across_ranks
from .buckets import DEFAULT_BUCKET_CAP_MB, ReadyInOrder, assign_buckets
from .collectives import (
    ALGORITHMS,
    Collectives,
    CommThread,
    broadcast_module_buffers,
    broadcast_module_state,
    now,
    world,
)
from .trace import CommCall, trace_comm

__all__ = [
    "ALGORITHMS",
    "DEFAULT_BUCKET_CAP_MB",
    "Collectives",
    "CommCall",
    "CommThread",
    "ReadyInOrder",
    "assign_buckets",
    "broadcast_module_buffers",
    "broadcast_module_state",
    "check_same_across_ranks",
    "now",
    "trace_comm",
    "world",
]
