"""ZeRO: shard the model state over the data-parallel ranks (notebook 06).

ZeRO removes data parallelism's redundant copies in three stages (each module names
its source); read in this order:

=============  ===================================================================
``flat``       :class:`FlatGroup`: parameters laid end to end in one buffer, padded,
               cut into K equal shards (what every stage partitions)
``optimizer``  :class:`ZeroOptimizer`: stage 1 (optimizer state sharded: all-reduce,
               step on my shard, all-gather) and stage 2 (gradients too:
               reduce-scatter in backward)
``fsdp``       :class:`FSDP`: stage 3, parameters sharded as well; each unit is
               all-gathered before its forward and backward, freed after, and its
               gradients reduce-scattered during backward
=============  ===================================================================

The collectives come from :mod:`distlab.parallel.comm`, the 16-bit policy FSDP
gathers in from :mod:`distlab.parallel.precision`.
"""

from __future__ import annotations

from .flat import FlatGroup, named_parameter_index
from .fsdp import FSDP
from .optimizer import ZeroOptimizer

__all__ = ["FSDP", "FlatGroup", "ZeroOptimizer", "named_parameter_index"]
