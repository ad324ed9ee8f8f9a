"""Checkpoints that resume bit for bit, or refuse by name (notebook 10).

=================  ===================================================================
``files``          a checkpoint folder is whole and verified (every file's SHA-256 in a
                   commit record written last) or refused with the reason
``data_parallel``  DDP, ZeRO and FSDP checkpoints: full (gathered, rank 0 writes one
                   file) or sharded (every rank writes its part with DCP, read back at
                   another world size)
=================  ===================================================================

A composed run (any :class:`~distlab.core.layout.Layout`) is checkpointed by
:mod:`distlab.parallel.compose.checkpoint`, which builds on these two: it has to know
the composed model's pieces, so it lives with them.
"""

from __future__ import annotations

from .data_parallel import (
    FSDPMasters,
    ShardedTraining,
    full_state,
    latest_verified_checkpoint,
    load_full,
    load_full_state,
    load_sharded,
    read_full,
    save_full,
    save_sharded,
    state_checksum,
    verify_sharded,
)
from .files import CheckpointError, CheckpointWarning, latest_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "FSDPMasters",
    "ShardedTraining",
    "full_state",
    "latest_checkpoint",
    "latest_verified_checkpoint",
    "load_full",
    "load_full_state",
    "load_sharded",
    "read_full",
    "save_full",
    "save_sharded",
    "state_checksum",
    "verify_sharded",
]
