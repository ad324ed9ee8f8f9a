"""3D parallelism: the tiny GPT trained with TP x PP x DP at once (Narayanan et al. 2021).

Megatron-LM's composition (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", Sections 2-3):
the world of ``t * p * d`` ranks is one grid (:func:`~distlab.parallel.mesh.build_mesh`,
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
     :class:`~distlab.parallel.zero.ZeroOptimizer` over the dp group
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

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distlab.core.checks import positive, positive_int
from distlab.core.ranks import check_degrees as check_world_degrees
from distlab.models import GPT, GPTConfig, check_batch
from distlab.parallel.comm import Collectives
from distlab.parallel.memory import optimizer_state_tensors, storage_bytes
from distlab.parallel.mesh import build_mesh
from distlab.parallel.pipeline import PipelineStage, Schedule, build, run_pipeline
from distlab.parallel.pipeline.partition import GPTEmbedding
from distlab.parallel.tensor import ParallelGPT, TensorParallelComm, vocab_parallel_cross_entropy
from distlab.parallel.tensor.checks import check_divisible
from distlab.parallel.tensor.layers import block_shard
from distlab.parallel.tensor.ops import copy_to_tp
from distlab.parallel.tensor.vocab import vocab_shard
from distlab.parallel.zero import ZeroOptimizer

#: optimizer name -> (torch class, its keyword arguments, the
#: :data:`distlab.calc.memory.RECIPES` entry whose bytes per parameter it keeps)
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {}, "sgd"),
    "sgd_momentum": (torch.optim.SGD, {"momentum": 0.9}, "sgd_momentum"),
    "adam": (torch.optim.Adam, {}, "fp32_adam"),
}
ZERO_STAGES = (0, 1)  # ZeRO-2 and -3 shard gradients and parameters: distlab.parallel.zero, fsdp


@dataclass
class ThreeDRun:
    """What one rank of a 3D run returns."""

    rank: int
    coordinates: dict[str, int]  # {"tp": .., "pp": .., "dp": .., ...}
    losses: list[float] | None  # full-batch loss per step, on the last stage's ranks
    shards: dict[str, torch.Tensor]  # this rank's final parameters, by ParallelGPT name
    parameters: int  # elements of this rank's (tp, pp) shard, Ψ_rank
    optimizer_state_bytes: int  # measured: the storages of the optimizer's state tensors
    step_seconds: list[float]  # wall time of each training step on this rank
    peak_activation_bytes: int  # the most the pipeline executor held for backward, over all steps


class _Head(nn.Module):
    """The last stage's final LayerNorm and output layer: this rank's slice of the logits."""

    def __init__(self, gpt: ParallelGPT) -> None:
        super().__init__()
        self.ln_f, self.comm = gpt.ln_f, gpt.comm
        self.weight = gpt.tok.weight if gpt.config.tie_embeddings else gpt.head_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(self.ln_f(x), self.comm, "head in"), self.weight)


def blocks_per_chunk(layers: int, stages: int, chunks: int = 1) -> int:
    """L/(p v) blocks in each of the p v virtual stages, or ``ValueError`` naming ``layers``."""
    if chunks == 1:
        return check_divisible("layers", layers, stages, by="pipeline-parallel size")
    by = f"number of virtual stages pp*chunks = {stages}*{chunks} ="
    return check_divisible("layers", layers, stages * chunks, by=by)


def tp_gpt_stage(gpt: ParallelGPT, stage: int, stages: int, chunks: int = 1) -> PipelineStage:
    """Rank ``stage``'s ``chunks`` model chunks of a tensor-parallel GPT cut into
    ``stages * chunks`` virtual stages of L/(p v) blocks each.

    Chunk c of rank r is virtual stage j = c p + r (Narayanan et al. 2021,
    Section 2.2.2) and holds blocks j L/(p v) .. (j + 1) L/(p v) - 1; virtual
    stage 0 (chunk 0 of rank 0) also holds the embedding, the last one
    (chunk v - 1 of rank p - 1) the head and the vocabulary-parallel loss.
    With tied embeddings those two ranks share ``tok.weight`` and add each
    other's part of its gradient after the backward passes."""
    virtual, per_chunk = stages * chunks, blocks_per_chunk(len(gpt.blocks), stages, chunks)
    modules = {}
    for chunk in range(chunks):
        j = chunk * stages + stage
        layers: list[nn.Module] = list(gpt.blocks[j * per_chunk : (j + 1) * per_chunk])
        if j == 0:
            layers.insert(0, GPTEmbedding(gpt))  # tok is vocabulary-parallel here
        if j == virtual - 1:
            layers.append(_Head(gpt))
        modules[chunk] = nn.Sequential(*layers)
    tied, peer = [], None
    if gpt.config.tie_embeddings and stages > 1 and stage in (0, stages - 1):
        tied, peer = [gpt.tok.weight], stages - 1 - stage

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(
            logits, targets, gpt.comm, start=gpt.tok.start, vocab=gpt.config.vocab
        )

    return PipelineStage(stage, stages, modules, loss_fn, tied, peer)


def dense_shard(name: str, dense: torch.Tensor, t: int, rank: int, vocab: int) -> torch.Tensor:
    """The slice of the dense GPT's parameter ``name`` that tensor-parallel rank
    ``rank`` of ``t`` holds in a :class:`ParallelGPT`: vocabulary rows (zero-padded)
    of ``tok.weight``/``head_weight``, :func:`block_shard` of a block's tensors,
    everything else whole."""
    if name.startswith("blocks."):
        return block_shard(name.split(".", 2)[2], dense, t, rank)
    if name in ("tok.weight", "head_weight", "head.weight"):
        start, stop, rows = vocab_shard(vocab, t, rank)
        padded = dense.new_zeros(rows, dense.shape[1])
        padded[: stop - start] = dense[start:stop]
        return padded
    return dense


def check_degrees(
    world_size: int, config: GPTConfig, *, tp: int, pp: int, dp: int, chunks: int = 1
) -> None:
    """``ValueError`` naming the value unless tp*pp*dp = world size
    (:func:`distlab.core.ranks.check_degrees`), pp*chunks | layers,
    tp | heads and tp | hidden."""
    check_world_degrees(world_size, tp=tp, pp=pp, dp=dp, cp=1, ep=1)
    chunks = positive_int("chunks", chunks)
    blocks_per_chunk(config.layers, pp, chunks)
    check_divisible("heads", config.heads, tp)
    check_divisible("hidden", config.hidden, tp)


def check_options(
    *, optimizer: str, zero_stage: int, schedule: str, pp: int, micro_batches: int, chunks: int = 1
) -> Schedule:
    """The pipeline schedule the options describe (:func:`~distlab.parallel.pipeline.build`),
    or ``ValueError`` naming an unknown optimizer, ZeRO stage or schedule, or a
    ``chunks``/``micro_batches`` the schedule cannot use (or ``chunks > 1`` with ``pp = 1``)."""
    if optimizer not in OPTIMIZERS:
        allowed = ", ".join(map(repr, OPTIMIZERS))
        raise ValueError(f"unknown optimizer {optimizer!r}; allowed: {allowed}")
    if isinstance(zero_stage, bool) or zero_stage not in ZERO_STAGES:
        raise ValueError(
            f"zero_stage must be 0 (average gradients over dp) or 1 (ZeRO-1: shard the optimizer "
            f"state over dp), got {zero_stage!r}"
        )
    plan = build(schedule, pp, micro_batches, chunks=chunks)
    if pp == 1 and chunks > 1:  # the executor would send each chunk's output to its own rank
        raise ValueError(
            f"chunks={chunks} needs pp >= 2: one pipeline stage has nothing to interleave"
        )
    return plan


def average_gradients(stage: PipelineStage, data_parallel: Collectives) -> None:
    """Plain data parallelism: every gradient of the stage averaged over the dp group."""
    for p in stage.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        data_parallel.all_reduce_mean_(p.grad)


class PlainSGD:
    """SGD without momentum, written out: ``p -= lr * p.grad``, what ``torch.optim.SGD(params, lr)``
    computes, with no state.

    Why not ``torch.optim.SGD``: its first ``zero_grad``/``step`` imports ``torch._dynamo``
    (and sympy), about 70 MB per process; the 8 ranks of notebook 09 on a 2 GB machine
    (Binder) cannot afford it. Momentum, Adam and ZeRO-1 still use torch's optimizers."""

    def __init__(self, params, lr: float) -> None:
        self.params, self.lr, self.state = list(params), lr, {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


def make_optimizer(stage: PipelineStage, name: str, lr: float, zero_stage: int, dp_group):
    """``(optimizer, torch optimizer holding the state)`` for this rank's stage.

    ``zero_stage=1``: :class:`~distlab.parallel.zero.ZeroOptimizer` over the dp
    group; it reduce-scatters the gradients in ``step()``, updates this rank's
    1/dp of the stage's flattened parameters and all-gathers them."""
    torch_class, kwargs, _ = OPTIMIZERS[name]
    if zero_stage == 0 and name == "sgd":
        optimizer = PlainSGD(stage.parameters(), lr=lr)
        return optimizer, optimizer
    if zero_stage == 0:
        optimizer = torch_class(stage.parameters(), lr=lr, **kwargs)
        return optimizer, optimizer
    chunks = nn.ModuleList(stage.chunks.values())
    zero = ZeroOptimizer(chunks, torch_class, stage=1, group=dp_group, lr=lr, **kwargs)
    return zero, zero.optimizer


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
) -> ThreeDRun:
    """Train ``GPT(config, seed=seed)`` for ``steps`` pipeline steps on the batch
    ``tokens``/``targets`` (b sequences; each data-parallel replica takes b/dp of
    them, cut into ``micro_batches``). Call on every rank inside ``distlab.run``.

    ``optimizer``: a key of :data:`OPTIMIZERS`; ``zero_stage``: 0 (all-reduce the
    gradients over dp) or 1 (ZeRO-1 over dp); ``schedule``: a key of
    :data:`distlab.core.pipeline_schedule.GENERATORS`, with ``chunks`` = v model
    chunks per rank for ``"interleaved"``. ``steps`` >= 1 and a finite ``lr`` > 0; ``tokens``
    and ``targets`` (batch, seq <= config.seq_len) ids of ``config``'s vocabulary."""
    steps, lr = positive_int("steps", steps), positive("lr", lr)
    check_batch(tokens, targets, config)
    check_degrees(dist.get_world_size(), config, tp=tp, pp=pp, dp=dp, chunks=chunks)
    plan = check_options(
        optimizer=optimizer, zero_stage=zero_stage, schedule=schedule, pp=pp,
        micro_batches=micro_batches, chunks=chunks,
    )  # fmt: skip
    check_divisible("batch", tokens.shape[0], dp * micro_batches, by="dp * micro_batches")
    mesh = build_mesh(tp=tp, pp=pp, dp=dp)
    where = mesh.coordinates
    gpt = ParallelGPT(GPT(config, seed=seed), TensorParallelComm(group=mesh["tp"]))
    stage = tp_gpt_stage(gpt, where["pp"], pp, chunks)
    data_parallel = Collectives(group=mesh["dp"])
    step_with, state_holder = make_optimizer(stage, optimizer, lr, zero_stage, mesh["dp"])
    my_tokens, my_targets = tokens.chunk(dp)[where["dp"]], targets.chunk(dp)[where["dp"]]
    losses, step_seconds, peak_activation_bytes = [], [], 0
    for _ in range(steps):
        start = time.perf_counter()
        step_with.zero_grad(set_to_none=True)
        run = run_pipeline(plan, stage, my_tokens, my_targets, stage_ranks=mesh.ranks("pp"))
        if zero_stage == 0:
            average_gradients(stage, data_parallel)
        step_with.step()  # ZeRO-1: reduce-scatter, update 1/dp, all-gather
        if run.loss is not None:
            loss = torch.tensor([run.loss], dtype=torch.float64)
            data_parallel.all_reduce_mean_(loss)
            losses.append(loss.item())
        step_seconds.append(time.perf_counter() - start)
        peak_activation_bytes = max(peak_activation_bytes, run.peak_activation_bytes)
    mine = {id(p) for p in stage.parameters()}
    shards = {n: p.detach().clone() for n, p in gpt.named_parameters() if id(p) in mine}
    states, _ = optimizer_state_tensors(state_holder)
    return ThreeDRun(
        dist.get_rank(),
        where,
        losses if mesh.is_last_stage else None,
        shards,
        sum(p.numel() for p in stage.parameters()),
        storage_bytes(states),
        step_seconds,
        peak_activation_bytes,
    )
