"""Data parallelism: every rank holds the model and reads its own samples (notebook 04).

Read in this order:

==================  ==================================================================
``sampler``         DistributedSampler's split: each rank reads its own samples
``ddp``             :class:`NaiveDDP` (all-reduce after backward) and
                    :class:`BucketedDDP` (buckets launched during backward: overlap)
``step_trace``      per-bucket timestamps of a step: is the communication hidden?
``ddp_timing``      naive against bucketed DDP, timed side by side in one run
``accumulation``    K micro-batches, loss / K, one optimizer step
``sync_batchnorm``  :class:`SyncBatchNorm`: batch statistics over every rank
``training``        :func:`~.training.build` / :func:`~.training.train_step`: one step
                    of any data-parallel method (DDP, ZeRO-1/2, FSDP, with or without
                    mixed precision) on any ``nn.Module``
==================  ==================================================================

``training`` is the one module here that reaches up: it builds ZeRO and FSDP
(:mod:`distlab.parallel.zero`) and the mixed-precision optimizer
(:mod:`distlab.parallel.precision`), so notebooks 04-06 and the benchmarks can run
every method through one interface. Why it stays beside
:func:`distlab.parallel.compose.train` rather than inside it is said in
:mod:`distlab.parallel.compose`.
"""

from __future__ import annotations

from .accumulation import accumulate_gradients, gradient_scale_error
from .ddp import BucketedDDP, NaiveDDP
from .ddp_timing import time_ddp_variants
from .sampler import ShardSampler, shard_batch, shard_indices
from .step_trace import BucketTimes, StepTrace
from .sync_batchnorm import SyncBatchNorm

__all__ = [
    "BucketTimes",
    "BucketedDDP",
    "NaiveDDP",
    "ShardSampler",
    "StepTrace",
    "SyncBatchNorm",
    "accumulate_gradients",
    "gradient_scale_error",
    "shard_batch",
    "shard_indices",
    "time_ddp_variants",
]
