"""Vocabulary-parallel embedding and cross-entropy: the logits are never gathered.

Shoeybi et al. 2019, Section 3: the input embedding E (V x h) is split by
rows (vocabulary) across the t ranks, and the output layer, which shares E,
produces each rank's V/t columns of the logits; the paper fuses the parallel
GEMM's output with the cross-entropy loss, so only b x s numbers cross the
ranks instead of the b x s x V logits. How the loss itself is reduced is an
implementation choice: see :class:`VocabParallelCrossEntropy`.

A vocabulary that t does not divide is padded to V_p = t ceil(V/t) rows
(Megatron's ``make-vocab-size-divisible-by``). The padding rows are zeros, no
token looks them up, and their logits are masked to -inf before the softmax:
left unmasked they would add exp(0) terms to every denominator and shift the
loss (Megatron-LM issue 1754).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import sequence as sp
from .ops import TensorParallelComm, all_gather, all_reduce, reduce_from_tp


def vocab_shard(vocab: int, t: int, rank: int) -> tuple[int, int, int]:
    """(start, stop, rows per rank) of rank ``rank``'s vocabulary rows: the padded
    vocabulary t ceil(V/t) is cut into t equal blocks; ``stop`` <= ``vocab``
    (rows from ``stop`` to ``start + rows`` are padding)."""
    rows = math.ceil(vocab / t)
    start = rank * rows
    return start, max(start, min(start + rows, vocab)), rows


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of a dense ``nn.Embedding`` (zero rows where padded).

    A token outside the rank's rows looks up nothing (zeros); the partial
    embeddings are summed by g (all-reduce), or with ``sequence_parallel`` by
    a reduce-scatter along the sequence (each rank keeps s/t tokens)."""

    def __init__(self, dense: nn.Embedding, comm: TensorParallelComm, *, sequence_parallel=False):
        super().__init__()
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.vocab = dense.num_embeddings
        self.start, stop, rows = vocab_shard(self.vocab, comm.world_size, comm.rank)
        weight = dense.weight.new_zeros(rows, dense.embedding_dim)
        weight[: stop - self.start] = dense.weight[self.start : stop].detach()
        self.weight = nn.Parameter(weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        partial = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        partial = partial * mine.unsqueeze(-1).to(partial.dtype)
        if self.sequence_parallel:
            return sp.reduce_scatter_to_sp(partial, self.comm, "embedding out")
        return reduce_from_tp(partial, self.comm, "embedding out")


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy from each rank's slice of the logits.

    loss_i = log sum_v exp(z_iv) - z_i,target. Each rank computes the
    log-sum-exp of its columns (padding masked to -inf); one all-gather of
    those t numbers per token gives the global one, and one all-reduce the
    target's logit (only its owner contributes). Backward needs no
    communication: dL/dz_iv = softmax(z_i)_v - [v = target].

    This is distlab's own variant. Megatron-LM's ``_VocabParallelCrossEntropy``
    uses three all-reduces per token: the max logit (for a stable softmax), the
    target's logit, and the sum of exp(z - max). Both are exact: a log-sum-exp
    splits over disjoint column sets, log sum_v exp(z_v) = log sum_r exp(lse_r),
    so gathering the t per-rank log-sum-exps gives the same number as
    reducing a max and a sum, in one collective instead of two.
    """

    @staticmethod
    def forward(ctx, logits, targets, comm: TensorParallelComm, start: int, vocab: int):
        z = logits.detach().float()
        columns = start + torch.arange(z.shape[-1], device=z.device)
        z = z.masked_fill(columns >= vocab, -math.inf)
        local_lse = torch.logsumexp(z, dim=-1)
        every_lse = all_gather(local_lse.unsqueeze(0), 0, comm, "forward", "loss log-sum-exp")
        lse = torch.logsumexp(every_lse, dim=0)
        local_target = targets - start
        mine = (local_target >= 0) & (local_target < z.shape[-1])
        picked = z.gather(-1, local_target.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        target_logit = all_reduce(picked * mine, comm, "forward", "loss target logit")
        ctx.save_for_backward(z, lse, local_target, mine)
        ctx.dtype = logits.dtype
        return lse - target_logit

    @staticmethod
    def backward(ctx, grad):
        z, lse, local_target, mine = ctx.saved_tensors
        d = torch.exp(z - lse.unsqueeze(-1))
        index = local_target.clamp(0, z.shape[-1] - 1).unsqueeze(-1)
        d.scatter_add_(-1, index, -mine.to(d.dtype).unsqueeze(-1))
        return (d * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, comm: TensorParallelComm, *, start: int, vocab: int
) -> torch.Tensor:
    """Mean cross-entropy over tokens; ``logits`` (..., V_p/t) is this rank's slice,
    starting at vocabulary row ``start``; ``targets`` (...) are global token ids."""
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets shape {tuple(targets.shape)} != logits {tuple(logits.shape)}")
    if targets.numel() and (targets.min() < 0 or targets.max() >= vocab):
        raise ValueError(f"targets must lie in [0, {vocab}), got {targets.min()}..{targets.max()}")
    return VocabParallelCrossEntropy.apply(logits, targets, comm, start, vocab).mean()
