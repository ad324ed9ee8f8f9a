"""The tiny GPT of :mod:`distlab.models`, tensor-parallel (and optionally sequence-parallel).

Token embedding and the tied output layer are vocabulary-parallel, the blocks
are :class:`~distlab.parallel.tensor.layers.ParallelBlock`, the position
embedding and final LayerNorm are replicated (or, with sequence parallelism,
applied to each rank's s/t tokens). ``loss`` never gathers the logits.

With context parallelism (``context=(cp, cp_rank, split)``, set by
:func:`distlab.parallel.compose.parallelize`) the tokens this rank gets are
its part of each sequence (:func:`distlab.parallel.context.ring.local_positions`),
and the position embedding uses their global positions.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from distlab.models import GPT
from distlab.parallel.comm.agreement import check_same_across_ranks, parameters
from distlab.parallel.context.ring import local_positions

from . import sequence as sp
from .checks import check_divisible
from .layers import ParallelBlock
from .ops import TensorParallelComm, copy_to_tp
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy


class ParallelGPT(nn.Module):
    """``ParallelGPT(GPT(config), comm, sequence_parallel=False)``: this rank's shard.

    ``forward(tokens)`` returns this rank's logits slice ``(b, s, V_p/t)``;
    ``loss(tokens, targets)`` the mean cross-entropy, equal on every rank.
    After ``loss.backward()`` call :meth:`finish_gradients` (sums the gradients
    of sequence-parallel LayerNorms and biases; nothing to do without SP).
    ``make_block(dense_block, comm, sequence_parallel=...)`` builds each block
    (default :class:`ParallelBlock`; :mod:`distlab.parallel.moe.gpt` passes one
    that makes the MoE blocks expert-parallel).
    """

    def __init__(
        self,
        dense: GPT,
        comm: TensorParallelComm,
        *,
        sequence_parallel=False,
        make_block=ParallelBlock,
        context: tuple[int, int, str] | None = None,
    ):
        super().__init__()
        c = dense.config
        t = comm.world_size
        check_divisible("hidden", c.hidden, t)
        check_divisible("heads", c.heads, t)
        if sequence_parallel:
            check_divisible("seq_len", c.seq_len, t)
        check_same_across_ranks(
            parameters("the dense GPT", dense),
            group=comm.group,
            among="the ranks of the tensor-parallel group",
            hint="each rank must shard the same dense model",
        )
        self.config, self.comm, self.sequence_parallel = c, comm, sequence_parallel
        self.context = context  # (cp, cp rank, split) or None
        self.tok = VocabParallelEmbedding(dense.tok, comm, sequence_parallel=sequence_parallel)
        self.pos = copy.deepcopy(dense.pos)
        self.blocks = nn.ModuleList(
            make_block(b, comm, sequence_parallel=sequence_parallel) for b in dense.blocks
        )
        self.ln_f = copy.deepcopy(dense.ln_f)
        if not c.tie_embeddings:  # the output layer's own rows, padded like the embedding's
            padded = dense.head.weight.new_zeros(self.tok.weight.shape[0] * t, c.hidden)
            padded[: c.vocab] = dense.head.weight.detach()
            self.head_weight = nn.Parameter(padded.chunk(t)[comm.rank].clone())
        if sequence_parallel:
            sp.mark_sequence_parallel(self.pos)
            sp.mark_sequence_parallel(self.ln_f)

    def _head(self) -> nn.Parameter:
        return self.tok.weight if self.config.tie_embeddings else self.head_weight

    def positions(self, s: int, device=None) -> torch.Tensor:
        """The global positions of the ``s`` tokens this rank embeds: 0..s-1, or this
        rank's part of a sequence of s * cp tokens (context parallelism)."""
        if self.context is None:
            return torch.arange(s, device=device)
        cp, rank, split = self.context
        return local_positions(s * cp, cp, rank, split).to(device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings: ``(b, s, h)``, or this rank's ``(b, s/t, h)`` with SP."""
        _, s = tokens.shape
        positions = self.positions(s, tokens.device)
        if positions.max() >= self.config.seq_len:
            raise ValueError(f"sequence length {s} exceeds config.seq_len={self.config.seq_len}")
        if self.sequence_parallel:
            check_divisible("sequence length", s, self.comm.world_size)
            positions = positions.chunk(self.comm.world_size)[self.comm.rank]
        return self.tok(tokens) + self.pos(positions)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and the (tied) output layer: this rank's slice ``(b, s, V_p/t)``."""
        x = self.ln_f(x)
        weight = self._head()
        if self.sequence_parallel:
            (logits,) = sp.LinearsOnGatheredSequence.apply(x, self.comm, "head in", weight, None)
            return logits
        return F.linear(copy_to_tp(x, self.comm, "head in"), weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.logits(x)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(tokens)
        return vocab_parallel_cross_entropy(
            logits, targets, self.comm, start=self.tok.start, vocab=self.config.vocab
        )

    def finish_gradients(self) -> None:
        """Sum the partial gradients of sequence-parallel parameters over the group."""
        if self.sequence_parallel:
            sp.sync_sequence_parallel_grads(self, self.comm)
