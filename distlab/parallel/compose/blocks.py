"""The pieces :func:`~distlab.parallel.compose.parallelize` puts into a tensor-parallel GPT.

* :class:`ContextParallelAttention`: Megatron's tensor-parallel attention (q, k, v
  column-parallel, a/t heads per rank, output projection row-parallel) whose
  attention core runs over the context-parallel group: each rank holds its part
  of every sequence, and the group's ``attend`` brings in the rest: ring attention
  (:class:`~distlab.parallel.context.ring.Ring`: K/V blocks passed round the cp ranks),
  Llama 3's K/V all-gather (:class:`~distlab.parallel.context.gather.KVGather`) or
  DeepSpeed-Ulysses' all-to-all (:class:`~distlab.parallel.context.ulysses.Ulysses`: heads/t
  must divide by cp), each on this rank's tensor-parallel heads. Tensor parallelism
  splits the heads, context parallelism the tokens: the two are independent.
* :class:`StageEmbedding` and :class:`StageHead`: the first and last layers of a
  pipeline cut of a :class:`~distlab.parallel.tensor.ParallelGPT`; they call the
  model's own :meth:`~distlab.parallel.tensor.ParallelGPT.embed` and
  :meth:`~distlab.parallel.tensor.ParallelGPT.logits`, so sequence and context
  parallelism work inside a pipeline exactly as without one.
* :class:`RecomputedBlock`: ``recompute="full"``, a whole block recomputed in backward.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from distlab.models import CausalSelfAttention
from distlab.parallel.context.ring import ContextGroup
from distlab.parallel.tensor import ParallelGPT, ParallelSelfAttention, TensorParallelComm
from distlab.parallel.tensor.rng import RNGTracker


class ContextParallelAttention(ParallelSelfAttention):
    """Tensor-parallel attention over this rank's tokens, the core computed by the
    context-parallel group ``cp`` (a ring, a K/V all-gather or Ulysses). Attention
    dropout must be 0 (none of the three applies dropout to the probabilities)."""

    def __init__(
        self,
        dense: CausalSelfAttention,
        comm: TensorParallelComm,
        cp: ContextGroup,
        *,
        sequence_parallel: bool = False,
    ) -> None:
        if dense.dropout:
            raise ValueError(
                f"context parallelism needs attention dropout 0, got {dense.dropout}: "
                "its attention cores apply no dropout to the attention probabilities"
            )
        super().__init__(dense, comm, sequence_parallel=sequence_parallel)
        cp.check_heads(self.heads)  # Ulysses splits this rank's heads again
        self.cp = cp

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = q.shape  # s: this rank's tokens, s * cp in the whole sequence
        out = self.cp.attend(q, k, v, s * self.cp.size)
        return out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)


class StageEmbedding(nn.Module):
    """The first virtual stage's first layer: ``gpt.embed(tokens)``."""

    def __init__(self, gpt: ParallelGPT) -> None:
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos  # registered here, so the stage owns them
        self._gpt = [gpt]  # a list: not a submodule (the stage must not own every block)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._gpt[0].embed(tokens)


class StageHead(nn.Module):
    """The last virtual stage's last layer: ``gpt.logits(x)`` (final LayerNorm, output layer)."""

    def __init__(self, gpt: ParallelGPT) -> None:
        super().__init__()
        self.ln_f = gpt.ln_f
        self.weight = gpt._head()
        self._gpt = [gpt]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._gpt[0].logits(x)


class RecomputedBlock(nn.Module):
    """Full activation recomputation (Chen et al. 2016, "Training Deep Nets with Sublinear
    Memory Cost"; Korthikanti et al. 2022, Table 2, "full activation recomputation": 2sbh
    bytes per layer in 16 bits): the block keeps only its
    input for backward, and backward runs its forward again (``torch.utils.checkpoint``,
    non-reentrant) before going through it. Per layer that keeps b s h elements instead
    of the block's every intermediate, for one more forward per block (the tensor-,
    context- and expert-parallel messages inside it are sent again).

    The recomputed forward must draw the same dropout masks: ``checkpoint`` restores the
    default random stream, and the tensor-parallel stream (``rng``, Megatron's tracker)
    is replayed from where it stood when the forward started (:meth:`RNGTracker.replay`).
    Wraps the block without renaming it: the stage holds the wrapper, the model's
    ``blocks`` list the block itself."""

    def __init__(self, block: nn.Module, rng: RNGTracker | None = None) -> None:
        super().__init__()
        self.block, self.rng = block, rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rng is None:
            return checkpoint(self.block, x, use_reentrant=False)
        states = self.rng.states
        return checkpoint(
            self.block,
            x,
            use_reentrant=False,
            context_fn=lambda: (contextlib.nullcontext(), self.rng.replay(states)),
        )
