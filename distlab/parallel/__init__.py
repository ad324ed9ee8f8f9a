"""Parallel training on real processes: DDP, ZeRO, FSDP, tensor, sequence, context and pipeline.

One idea per module, each short enough to read top to bottom:

==================  ===========================================================
``data``            DistributedSampler's split: each rank reads its own samples
``comm``            the collectives (distlab's own or built-in), a comm thread
``buckets``         DDP's gradient buckets; launching them in order in backward
``trace``           per-bucket timestamps: gradient ready, all-reduce start/end
``ddp``             :class:`NaiveDDP` and :class:`BucketedDDP` (overlap)
``ddp_timing``      naive against bucketed DDP, step times side by side
``accumulation``    K micro-batches, loss / K, communicate once
``mixed_precision`` bf16/fp16 weights, fp32 masters, loss scale, FSDP's policy
``flat``            flat parameters cut into K shards
``zero``            :class:`ZeroOptimizer`: ZeRO stages 1 and 2
``fsdp``            :class:`FSDP`: ZeRO stage 3, per-unit gather and free
``checkpoint``      full (rank 0) and sharded (DCP) checkpoints, resharding
``sync_batchnorm``  :class:`SyncBatchNorm` against per-rank BatchNorm
``memory``          measured bytes of parameters, gradients, optimizer state
``pipeline/``       pipeline parallelism: stages, executor (schedules as data)
``tensor/``         Megatron tensor parallelism: f/g, column/row layers, GPT,
                    and its extension, sequence parallelism (``tensor.sequence``)
``context``         context parallelism: ring attention, zig-zag split
``context_gather``  context parallelism by all-gathering K/V (Llama 3)
``ulysses``         context parallelism by all-to-all over the heads (DeepSpeed-Ulysses)
``sharding/``       sharded matmuls in named-axis notation: which case, what to send
``moe``             :class:`MoE`, :class:`ExpertParallelMoE`: experts over all-to-all
``mesh``            :func:`build_mesh`: every process group (tp, cp, ep, dp, pp) by name
``moe_gpt``         the GPT with MoE blocks, and its expert-parallel block
``compose/``        :func:`parallelize` (any :class:`~distlab.core.layout.Layout` applied
                    to a plain GPT, in one fixed order) and :func:`train`, the one loop
``three_d``         :func:`train_3d`: TP x PP x DP, one setting of :func:`train`
==================  ===========================================================

Everything runs inside ``distlab.run(fn, world_size)`` (gloo on CPU by
default); the collective is chosen per wrapper with ``algorithm="ring"``
(or any key of :data:`distlab.sim.algorithms.ALL_REDUCE`) or ``"builtin"``.
"""

from __future__ import annotations

from . import pipeline
from .accumulation import accumulate_gradients, gradient_scale_error
from .checkpoint import (
    latest_verified_checkpoint,
    load_full,
    load_sharded,
    save_full,
    save_sharded,
)
from .checkpoint_files import CheckpointError, CheckpointWarning, latest_checkpoint
from .comm import ALGORITHMS, Collectives, CommThread
from .compose import ComposedRun, parallelize, train
from .context import ContextParallelBlock, Ring, ring_attention
from .data import ShardSampler, shard_batch, shard_indices
from .ddp import BucketedDDP, NaiveDDP
from .ddp_timing import time_ddp_variants
from .fsdp import FSDP
from .memory import MeasuredModelState, measure_model_state, storage_bytes
from .mesh import ParallelMesh, build_mesh
from .mixed_precision import (
    DynamicLossScaler,
    MixedPrecisionOptimizer,
    MixedPrecisionPolicy,
    autocast,
)
from .moe import ExpertParallelMoE, MoE, average_moe_gradients
from .sync_batchnorm import SyncBatchNorm
from .tensor import ParallelBlock, ParallelGPT, TensorParallelComm
from .trace import BucketTimes, StepTrace
from .zero import ZeroOptimizer

__all__ = [
    "ALGORITHMS",
    "FSDP",
    "BucketTimes",
    "BucketedDDP",
    "CheckpointError",
    "CheckpointWarning",
    "Collectives",
    "CommThread",
    "ComposedRun",
    "ContextParallelBlock",
    "DynamicLossScaler",
    "ExpertParallelMoE",
    "MeasuredModelState",
    "MixedPrecisionOptimizer",
    "MixedPrecisionPolicy",
    "MoE",
    "NaiveDDP",
    "ParallelBlock",
    "ParallelGPT",
    "ParallelMesh",
    "Ring",
    "ShardSampler",
    "StepTrace",
    "SyncBatchNorm",
    "TensorParallelComm",
    "ZeroOptimizer",
    "accumulate_gradients",
    "autocast",
    "average_moe_gradients",
    "build_mesh",
    "gradient_scale_error",
    "latest_checkpoint",
    "latest_verified_checkpoint",
    "load_full",
    "load_sharded",
    "measure_model_state",
    "parallelize",
    "pipeline",
    "ring_attention",
    "save_full",
    "save_sharded",
    "shard_batch",
    "shard_indices",
    "storage_bytes",
    "time_ddp_variants",
    "train",
]
