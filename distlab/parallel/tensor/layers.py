"""Megatron-LM's tensor-parallel transformer layer, built from a dense one's weights.

Shoeybi et al. 2019, Section 3 (Figures 3a, 3b); Narayanan et al. 2021,
Section 2.3. With t ranks:

* MLP: Y = GeLU(X A), Z = Y B. A is split by columns (A = [A_1 .. A_t]), so
  each rank computes its Y_i = GeLU(X A_i) with no communication (GeLU is
  elementwise); B is split by rows, each rank computes Y_i B_i and one
  all-reduce sums them: f before, g after.
* Self-attention: Q, K, V are split by columns, i.e. by heads (a/t heads per
  rank, no communication inside attention), the output projection by rows:
  again f before, g after.

So a layer all-reduces its b x s x h output twice in forward (two g) and its
input gradient twice in backward (two f). With ``sequence_parallel=True``
(:mod:`distlab.parallel.tensor.sequence`) the LayerNorm regions hold s/t tokens and
each f/g pair becomes an all-gather and a reduce-scatter.

Each parallel module is made with ``from_dense(module, comm)``: the rank's
shard of the dense module's weights, so tests compare against the dense
module directly. Parameter names are the dense ones (``attn.q.weight``...).

Dropout: with ``rng=`` an :class:`~distlab.parallel.tensor.rng.RNGTracker`,
the masks of sharded activations (attention probabilities; with sequence
parallelism also the residual branches' s/t tokens) come from each rank's
own tracked stream, and those of replicated activations from the default
stream, seeded alike on every rank. Without one every dropout draws from the
default stream: the same mask for every rank's heads
(:mod:`distlab.parallel.tensor.rng` shows why that is wrong).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from distlab.models import CausalSelfAttention, FeedForward, GPTBlock, dropout

from . import sequence as sp
from .checks import check_divisible
from .ops import TensorParallelComm, copy_to_tp, reduce_from_tp
from .rng import RNGTracker, parallel_region


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone())


class ColumnParallelLinear(nn.Module):
    """Rows [r n/t, (r+1) n/t) of a dense ``nn.Linear(in, n)``'s weight and bias:
    Y_r = X A_r + b_r, this rank's n/t output features. No communication: the
    caller gives every rank the whole X (after f, or gathered by SP's g)."""

    def __init__(self, dense: nn.Linear, comm: TensorParallelComm, *, name: str = "linear"):
        super().__init__()
        n = check_divisible(f"{name}.out_features", dense.out_features, comm.world_size)
        rows = slice(comm.rank * n, (comm.rank + 1) * n)
        self.weight = _param(dense.weight[rows])
        self.bias = None if dense.bias is None else _param(dense.bias[rows])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Columns [r n/t, (r+1) n/t) of a dense ``nn.Linear(n, out)``'s weight:
    Z = sum_r X_r B_r + b. The partial products are summed by g (all-reduce),
    or by SP's ḡ (reduce-scatter along the sequence); the bias, whole on every
    rank, is added after the sum."""

    def __init__(
        self,
        dense: nn.Linear,
        comm: TensorParallelComm,
        *,
        sequence_parallel: bool = False,
        name: str = "linear",
    ):
        super().__init__()
        n = check_divisible(f"{name}.in_features", dense.in_features, comm.world_size)
        self.comm, self.sequence_parallel, self.name = comm, sequence_parallel, name
        self.weight = _param(dense.weight[:, comm.rank * n : (comm.rank + 1) * n])
        self.bias = None if dense.bias is None else _param(dense.bias)
        if sequence_parallel and self.bias is not None:
            self.bias.sequence_parallel = True  # added to s/t tokens: a partial gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            z = sp.reduce_scatter_to_sp(partial, self.comm, f"{self.name} out")
        else:
            z = reduce_from_tp(partial, self.comm, f"{self.name} out")
        return z if self.bias is None else z + self.bias


class ParallelMLP(nn.Module):
    """fc1 column-parallel, GeLU, fc2 row-parallel: one all-reduce forward, one backward."""

    def __init__(
        self,
        dense: FeedForward,
        comm: TensorParallelComm,
        *,
        sequence_parallel=False,
        rng: RNGTracker | None = None,
    ):
        super().__init__()
        self.comm, self.sequence_parallel, self.dropout = comm, sequence_parallel, dense.dropout
        self.rng = rng
        self.fc1 = ColumnParallelLinear(dense.fc1, comm, name="mlp.fc1")
        self.fc2 = RowParallelLinear(
            dense.fc2, comm, sequence_parallel=sequence_parallel, name="mlp.fc2"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            (hidden,) = sp.linears_on_gathered_sequence(x, [self.fc1], self.comm, "mlp in")
        else:
            hidden = self.fc1(copy_to_tp(x, self.comm, "mlp in"))
        out = self.fc2(F.gelu(hidden))
        with parallel_region(self.rng if self.sequence_parallel else None):
            return dropout(out, self.dropout, self.training)


class ParallelSelfAttention(nn.Module):
    """q, k, v column-parallel (a/t heads per rank, no all-gather after them),
    causal attention on the local heads, output projection row-parallel.

    ``recompute_attention=True`` is Korthikanti et al.'s selective activation
    recomputation (Section 5): the attention core (QK^T, softmax, dropout,
    attention over V) keeps only Q, K, V and is recomputed in backward, which
    drops the 5as^2b/t bytes of scores, probabilities and dropout mask.
    ``rng``: see the module docstring (the fork wraps the checkpoint, so the
    recomputed mask is the forward's)."""

    def __init__(
        self,
        dense: CausalSelfAttention,
        comm: TensorParallelComm,
        *,
        sequence_parallel=False,
        recompute_attention=False,
        rng: RNGTracker | None = None,
    ):
        super().__init__()
        self.comm, self.sequence_parallel, self.rng = comm, sequence_parallel, rng
        self.recompute_attention = recompute_attention
        self.heads = check_divisible("heads", dense.heads, comm.world_size)
        self.head_dim, self.dropout = dense.head_dim, dense.dropout
        self.q = ColumnParallelLinear(dense.q, comm, name="attn.q")
        self.k = ColumnParallelLinear(dense.k, comm, name="attn.k")
        self.v = ColumnParallelLinear(dense.v, comm, name="attn.v")
        self.proj = RowParallelLinear(
            dense.proj, comm, sequence_parallel=sequence_parallel, name="attn.proj"
        )
        self.register_buffer("mask", dense.mask.clone(), persistent=False)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            qkv = sp.linears_on_gathered_sequence(x, [self.q, self.k, self.v], self.comm, "attn in")
        else:
            x = copy_to_tp(x, self.comm, "attn in")
            qkv = self.q(x), self.k(x), self.v(x)
        q, k, v = (self._split(t) for t in qkv)
        with parallel_region(self.rng):
            if self.recompute_attention:
                out = checkpoint(self._core, q, k, v, use_reentrant=True)
            else:
                out = self._core(q, k, v)
        out = self.proj(out)
        with parallel_region(self.rng if self.sequence_parallel else None):
            return dropout(out, self.dropout, self.training)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = q.shape
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores + self.mask[:s, :s].to(scores.dtype)
        probs = dropout(scores.softmax(dim=-1), self.dropout, self.training)
        return (probs @ v).transpose(1, 2).reshape(b, s, self.heads * self.head_dim)


class ParallelBlock(nn.Module):
    """A tensor-parallel :class:`~distlab.models.GPTBlock`: x + attn(ln1(x)), + mlp(ln2(.)).

    Input and output are the whole ``(b, s, h)`` on every rank, or with
    ``sequence_parallel=True`` this rank's ``(b, s/t, h)`` slice of the sequence.
    ``recompute_attention``: see :class:`ParallelSelfAttention`; ``rng``: see the
    module docstring.
    """

    def __init__(
        self,
        dense: GPTBlock,
        comm: TensorParallelComm,
        *,
        sequence_parallel=False,
        recompute_attention=False,
        rng: RNGTracker | None = None,
    ):
        super().__init__()
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.ln1 = copy.deepcopy(dense.ln1)
        self.attn = ParallelSelfAttention(
            dense.attn,
            comm,
            sequence_parallel=sequence_parallel,
            recompute_attention=recompute_attention,
            rng=rng,
        )
        self.ln2 = copy.deepcopy(dense.ln2)
        self.mlp = ParallelMLP(dense.mlp, comm, sequence_parallel=sequence_parallel, rng=rng)
        if sequence_parallel:
            sp.mark_sequence_parallel(self.ln1)
            sp.mark_sequence_parallel(self.ln2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel and x.shape[1] * self.comm.world_size > self.attn.mask.shape[0]:
            raise ValueError(
                f"sequence slice of {x.shape[1]} tokens x t={self.comm.world_size} exceeds "
                f"max_seq_len={self.attn.mask.shape[0]}"
            )
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


COLUMN_PARALLEL = ("attn.q.", "attn.k.", "attn.v.", "mlp.fc1.")  # split by output rows
ROW_PARALLEL = ("attn.proj.weight", "mlp.fc2.weight")  # split by input columns


def block_shard(name: str, dense: torch.Tensor, t: int, rank: int) -> torch.Tensor:
    """The slice of a dense :class:`~distlab.models.GPTBlock` tensor named ``name``
    (a parameter or its gradient) that rank ``rank`` of ``t`` holds in a
    :class:`ParallelBlock`: rows of q, k, v, fc1; columns of proj and fc2's
    weights; everything else (LayerNorms, proj and fc2 biases) whole."""
    if name.startswith(COLUMN_PARALLEL):
        return dense.chunk(t, 0)[rank]
    if name in ROW_PARALLEL:
        return dense.chunk(t, 1)[rank]
    return dense
