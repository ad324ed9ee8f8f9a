"""Megatron-style tensor parallelism on real processes (Shoeybi et al. 2019, Section 3).

==============  ==============================================================
``ops``         f, g, split, gather as autograd functions; the logged comm
``layers``      column/row-parallel linears, parallel MLP, attention, block
``vocab``       vocabulary-parallel embedding and cross-entropy (padding)
``model``       :class:`ParallelGPT`, the tiny GPT sharded
``checks``      bad input found on every rank before any collective
``activations`` measured saved-for-backward bytes (saved-tensor hooks)
``overlap``     the collective matmul: all-gather (or reduce-scatter) pipelined
                with the matmul in chunks, timelines and exposed communication
``rng``         dropout under TP: a seed per TP rank inside the parallel region,
                one seed outside it (Megatron's RNG tracker)
==============  ==============================================================

Sequence parallelism is :mod:`distlab.parallel.tensor.sequence`, context
parallelism (ring attention) :mod:`distlab.parallel.context.ring`.
"""

from __future__ import annotations

from .layers import (
    ColumnParallelLinear,
    ParallelBlock,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
)
from .model import ParallelGPT
from .ops import (
    CommEvent,
    CopyToTensorParallel,
    GatherFromTensorParallel,
    ReduceFromTensorParallel,
    SplitToTensorParallel,
    TensorParallelComm,
)
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy, vocab_shard

__all__ = [
    "ColumnParallelLinear",
    "CommEvent",
    "CopyToTensorParallel",
    "GatherFromTensorParallel",
    "ParallelBlock",
    "ParallelGPT",
    "ParallelMLP",
    "ParallelSelfAttention",
    "ReduceFromTensorParallel",
    "RowParallelLinear",
    "SplitToTensorParallel",
    "TensorParallelComm",
    "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy",
    "vocab_shard",
]
