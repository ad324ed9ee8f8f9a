"""3D parallelism: the tiny GPT trained with TP x PP x DP at once (Narayanan et al. 2021).

Megatron-LM's composition (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", Sections 2-3):
the world of ``t * p * d`` ranks is one grid (:func:`~distlab.parallel.mesh.build_mesh`,
tensor parallelism innermost, pipeline outermost). Each rank

1. holds its tensor-parallel shard (:class:`~distlab.parallel.tensor.ParallelGPT`)
   of its pipeline stage's layers: the embedding and the first L/p blocks on
   stage 0, ..., the last L/p blocks and the head on stage p - 1;
2. runs one 1F1B step (:func:`~distlab.parallel.pipeline.run_pipeline`) on its
   data-parallel replica's b/d sequences, sending activations to the same
   (tp, dp) coordinate of the next stage; the t ranks of a stage run the
   same schedule and meet in the tensor-parallel all-reduces;
3. averages every gradient over its data-parallel group (the d ranks with the
   same tp and pp coordinates hold the same shard), then steps SGD.

Each replica's loss is the mean over its b/d sequences, so the mean of the d
losses and of the d gradients is the full batch's: one step equals one
single-process step on the whole batch, up to fp32 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distlab.models import GPT, GPTConfig
from distlab.parallel.comm import Collectives
from distlab.parallel.mesh import build_mesh
from distlab.parallel.pipeline import PipelineStage, build, run_pipeline
from distlab.parallel.tensor import ParallelGPT, TensorParallelComm, vocab_parallel_cross_entropy
from distlab.parallel.tensor.checks import check_divisible
from distlab.parallel.tensor.layers import block_shard
from distlab.parallel.tensor.ops import copy_to_tp
from distlab.parallel.tensor.vocab import vocab_shard


@dataclass
class ThreeDRun:
    """What one rank of a 3D run returns."""

    rank: int
    coordinates: dict[str, int]  # {"tp": .., "pp": .., "dp": .., ...}
    losses: list[float] | None  # full-batch loss per step, on the last stage's ranks
    shards: dict[str, torch.Tensor]  # this rank's final parameters, by ParallelGPT name


class _Embedding(nn.Module):
    """Stage 0's first layer: vocabulary-parallel token embedding + position embedding."""

    def __init__(self, gpt: ParallelGPT) -> None:
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))


class _Head(nn.Module):
    """The last stage's final LayerNorm and output layer: this rank's slice of the logits."""

    def __init__(self, gpt: ParallelGPT) -> None:
        super().__init__()
        self.ln_f, self.comm = gpt.ln_f, gpt.comm
        self.weight = gpt.tok.weight if gpt.config.tie_embeddings else gpt.head_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(self.ln_f(x), self.comm, "head in"), self.weight)


def tp_gpt_stage(gpt: ParallelGPT, stage: int, stages: int) -> PipelineStage:
    """Stage ``stage`` of ``stages`` of a tensor-parallel GPT: L/p blocks each, the
    embedding on the first stage, the head and vocabulary-parallel loss on the last."""
    per_stage = check_divisible("layers", len(gpt.blocks), stages, by="pipeline-parallel size")
    layers: list[nn.Module] = list(gpt.blocks[stage * per_stage : (stage + 1) * per_stage])
    if stage == 0:
        layers.insert(0, _Embedding(gpt))
    if stage == stages - 1:
        layers.append(_Head(gpt))
    tied, peer = [], None
    if gpt.config.tie_embeddings and stages > 1 and stage in (0, stages - 1):
        tied, peer = [gpt.tok.weight], stages - 1 - stage

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(
            logits, targets, gpt.comm, start=gpt.tok.start, vocab=gpt.config.vocab
        )

    return PipelineStage(stage, stages, {0: nn.Sequential(*layers)}, loss_fn, tied, peer)


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


def check_degrees(world_size: int, config: GPTConfig, *, tp: int, pp: int, dp: int) -> None:
    """``ValueError`` naming the value unless tp*pp*dp = world size, pp | layers, tp | heads."""
    for name, degree in (("tp", tp), ("pp", pp), ("dp", dp)):
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {degree!r}")
    if tp * pp * dp != world_size:
        raise ValueError(
            f"tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} != world_size={world_size}: "
            f"choose degrees whose product is the number of processes"
        )
    check_divisible("layers", config.layers, pp, by="pipeline-parallel size")
    check_divisible("heads", config.heads, tp)
    check_divisible("hidden", config.hidden, tp)


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
) -> ThreeDRun:
    """Train ``GPT(config, seed=seed)`` with plain SGD for ``steps`` 1F1B steps on the
    batch ``tokens``/``targets`` (b sequences; each data-parallel replica takes b/dp of
    them, cut into ``micro_batches``). Call on every rank inside ``distlab.run``."""
    check_degrees(dist.get_world_size(), config, tp=tp, pp=pp, dp=dp)
    check_divisible("batch", tokens.shape[0], dp * micro_batches, by="dp * micro_batches")
    mesh = build_mesh(tp=tp, pp=pp, dp=dp)
    where = mesh.coordinates
    gpt = ParallelGPT(GPT(config, seed=seed), TensorParallelComm(group=mesh["tp"]))
    stage = tp_gpt_stage(gpt, where["pp"], pp)
    schedule = build("1f1b", pp, micro_batches)
    data_parallel = Collectives(group=mesh["dp"])
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    my_tokens, my_targets = tokens.chunk(dp)[where["dp"]], targets.chunk(dp)[where["dp"]]
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        run = run_pipeline(schedule, stage, my_tokens, my_targets, stage_ranks=mesh.ranks("pp"))
        for p in stage.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            data_parallel.all_reduce_mean_(p.grad)
        optimizer.step()
        if run.loss is not None:
            loss = torch.tensor([run.loss], dtype=torch.float64)
            data_parallel.all_reduce_mean_(loss)
            losses.append(loss.item())
    mine = {id(p) for p in stage.parameters()}
    shards = {n: p.detach().clone() for n, p in gpt.named_parameters() if id(p) in mine}
    return ThreeDRun(dist.get_rank(), where, losses if mesh.is_last_stage else None, shards)
