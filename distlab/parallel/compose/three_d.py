"""3D parallelism: the tiny GPT trained with TP x PP x DP at once (Narayanan et al. 2021, §2-3).

:func:`train_3d` is one setting of the one runner: it builds the
:class:`~distlab.core.layout.Layout` ``Layout(tp, pp, dp, zero_stage, ...)`` and
calls :func:`distlab.parallel.compose.train`, which applies every parallelism in
one fixed order (:mod:`distlab.parallel.compose.model`). What it does, step by step:

Megatron-LM's composition (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", Sections 2-3):
the world of ``t * p * d`` ranks is one grid (:func:`~distlab.parallel.compose.mesh.build_mesh`,
tensor parallelism innermost, pipeline outermost). Each rank

1. holds its tensor-parallel shard (:class:`~distlab.parallel.tensor.ParallelGPT`)
   of its pipeline stage's layers. With v = ``chunks`` model chunks per rank the
   L blocks are cut into p v virtual stages of L/(p v) blocks; chunk c of the
   rank at stage r is virtual stage j = c p + r (Section 2.2.2), so stage r
   holds chunks r, r + p, r + 2p, ... The embedding sits on virtual stage 0
   (chunk 0 of stage 0), the head on virtual stage p v - 1 (the last chunk of
   stage p - 1); with tied embeddings those two ranks add each other's part of
   the shared weight's gradient;
2. runs one pipeline step (:func:`~distlab.parallel.pipeline.run_pipeline`,
   ``schedule`` "1f1b", "gpipe", "zb_h1" or "interleaved") on its data-parallel
   replica's b/d sequences, sending activations to the same (tp, dp) coordinate
   of the next stage; the t ranks of a stage run the same schedule and meet in
   the tensor-parallel all-reduces. The interleaved schedule's bubble is
   (p - 1)/(v m) of the ideal step instead of (p - 1)/m, for v times more
   point-to-point messages (Section 2.2.2; :mod:`distlab.calc.pipeline`);
3. updates its shard, in one of two ways over the d ranks with the same tp and
   pp coordinates (which hold the same shard, Ψ_rank elements):

   * ``zero_stage=0``: all-reduce (average) every gradient, then every rank
     steps the optimizer on the whole shard: K Ψ_rank bytes of optimizer state
     per rank (K = 4 for SGD with momentum, 8 for fp32 Adam);
   * ``zero_stage=1`` (ZeRO-1, P_os; Rajbhandari et al. 2020, Section 5.1):
     :class:`~distlab.parallel.zero.optimizer.ZeroOptimizer` over the dp group
     reduce-scatters the gradients, each rank updates its 1/d of the shard
     with K Ψ_rank / d bytes of optimizer state, and an all-gather returns the
     updated parameters. Ψ_rank (d - 1)/d elements in each collective: the same
     2 Ψ_rank (d - 1)/d as the all-reduce it replaces (Section 7.2.1).
     :func:`distlab.calc.memory.model_state_bytes` gives the same bytes (up to
     fewer than d padding elements per flat bucket).

Each replica's loss is the mean over its b/d sequences, so the mean of the d
losses and of the d gradients is the full batch's: one step equals one
single-process step on the whole batch, up to fp32 rounding, and so does
every optimizer step (SGD, momentum and Adam act element by element, so
updating 1/d of the elements on each rank is the same update). Adam divides
by the root of its second moment, so where a gradient nearly cancels it
magnifies fp32 rounding: compare Adam runs with a looser tolerance than SGD's.
"""

from __future__ import annotations

import torch

from distlab.core.layout import Layout
from distlab.models import GPT, GPTConfig

from .loop import ComposedRun, train


def train_3d(
    config: GPTConfig,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *,
    tp: int,
    pp: int,
    dp: int,
    micro_batches: int,
    steps: int,
    lr: float,
    seed: int = 0,
    optimizer: str = "sgd",
    zero_stage: int = 0,
    schedule: str = "1f1b",
    chunks: int = 1,
) -> ComposedRun:
    """Train ``GPT(config, seed=seed)`` for ``steps`` pipeline steps on the batch
    ``tokens``/``targets`` (b sequences; each data-parallel replica takes b/dp of
    them, cut into ``micro_batches``). Call on every rank inside ``distlab.run``.

    The same as ``compose.train(GPT(config, seed=seed), Layout(tp=tp, pp=pp, dp=dp,
    zero_stage=zero_stage, schedule=schedule, virtual_stages=chunks,
    micro_batches=micro_batches), tokens, targets, steps=steps, lr=lr,
    optimizer=optimizer)``: ``optimizer`` a key of
    :data:`distlab.parallel.compose.OPTIMIZERS`, ``zero_stage`` 0 (all-reduce the
    gradients over dp) or 1 (ZeRO-1), ``schedule`` a key of
    :data:`distlab.core.pipeline_schedule.GENERATORS` with ``chunks`` = v model
    chunks per rank for ``"interleaved"``."""
    layout = Layout(
        tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, schedule=schedule, virtual_stages=chunks,
        micro_batches=micro_batches,
    )  # fmt: skip
    model = GPT(config, seed=seed)
    return train(model, layout, tokens, targets, steps=steps, lr=lr, optimizer=optimizer)
