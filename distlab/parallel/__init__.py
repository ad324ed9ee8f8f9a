"""Parallel training on real processes, in families that follow the course.

Each family is a folder whose ``__init__`` says what is inside and in which order
to read it:

================  ===============================================  ==========
family            what it holds                                    notebook
================  ===============================================  ==========
``comm/``         the collectives a wrapper calls, the comm        02-04
                  thread, gradient buckets, rank agreement,
                  tracing every message by group
``data/``         data parallelism: the sampler, DDP (naive and    04
                  bucketed), accumulation, SyncBatchNorm, and
                  ``training``: one step of any data-parallel
                  method on any module
``precision/``    measured model-state bytes; mixed precision      01, 05
                  (16-bit compute, fp32 masters, loss scaling)
``zero/``         ZeRO stages 1-2 (:class:`ZeroOptimizer`) and     06
                  stage 3 (:class:`FSDP`) on flat parameters
``tensor/``       Megatron tensor parallelism and its sequence     07
                  parallelism (``tensor.sequence``)
``context/``      context parallelism: ring attention, K/V         07
                  all-gather, Ulysses
``pipeline/``     pipeline stages and the executor that runs a     08
                  schedule (schedules are data, in ``core``)
``moe/``          mixture of experts, expert parallelism, the      09
                  MoE GPT
``compose/``      any :class:`~distlab.core.layout.Layout` on      09
                  the GPT: the device mesh, ``parallelize``,
                  ``train``, its checkpoints and traffic, 3D
``checkpoint/``   full and sharded checkpoints, verified folders   10
``sharding/``     sharded matmuls in named-axis notation: which    13
                  case, what to send
================  ===============================================  ==========

The families stand on floors (``tests/test_layers.py`` checks them): ``comm`` at the
ground; ``precision``, ``context`` and ``pipeline`` on it; ``zero`` and ``tensor`` above
those; ``data`` (its ``training`` builds ZeRO and FSDP), ``moe``, ``checkpoint`` and
``sharding`` above them; ``compose`` on top. A family imports only families on lower
floors.

Everything runs inside ``distlab.run(fn, world_size)`` (gloo on CPU by default); the
collective is chosen per wrapper with ``algorithm="ring"`` (or any key of
:data:`distlab.sim.algorithms.ALL_REDUCE`) or ``"builtin"``. The names below are the
ones the notebooks use most; every other name is in its family. Module paths from
before the families still import, with a warning naming the new one
(:mod:`distlab.parallel.moved`).
"""

from __future__ import annotations

from . import moved, pipeline
from .checkpoint import (
    CheckpointError,
    CheckpointWarning,
    latest_checkpoint,
    latest_verified_checkpoint,
    load_full,
    load_sharded,
    save_full,
    save_sharded,
)
from .comm import ALGORITHMS, Collectives, CommThread
from .compose import ComposedRun, ParallelMesh, build_mesh, parallelize, train
from .context import ContextParallelBlock, Ring, ring_attention
from .data import (
    BucketedDDP,
    BucketTimes,
    NaiveDDP,
    ShardSampler,
    StepTrace,
    SyncBatchNorm,
    accumulate_gradients,
    gradient_scale_error,
    shard_batch,
    shard_indices,
    time_ddp_variants,
)
from .moe import ExpertParallelMoE, MoE, average_moe_gradients
from .precision import (
    DynamicLossScaler,
    MeasuredModelState,
    MixedPrecisionOptimizer,
    MixedPrecisionPolicy,
    autocast,
    measure_model_state,
    storage_bytes,
)
from .tensor import ParallelBlock, ParallelGPT, TensorParallelComm
from .zero import FSDP, ZeroOptimizer

moved.install()

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
