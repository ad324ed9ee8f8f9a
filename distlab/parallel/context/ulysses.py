"""DeepSpeed-Ulysses: attention over a sequence split across ranks, by all-to-all.

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling
Training of Extreme Long Sequence Transformer Models", Section 3. Each of N
ranks holds s/N tokens of every head of Q, K and V, ``(b, a, s/N, d)``. An
all-to-all re-splits them by heads: rank r sends head group j (heads
``j a/N .. (j+1) a/N - 1``) of its tokens to rank j and receives its own head
group of every rank's tokens, ``(b, a/N, s, d)``. Attention then runs
locally and exactly over the whole sequence, one head group per rank, and a
second all-to-all sends each rank's tokens of the output home::

    (b, a, s/N, d) --all-to-all--> (b, a/N, s, d) --attention--> (b, a/N, s, d)
                   --all-to-all--> (b, a, s/N, d)

An all-to-all transposes the (rank x block) matrix, so its backward is the
reverse all-to-all (split and concatenated dimensions swapped):
:class:`SwapSplit`. Per layer a rank runs four all-to-alls forward (Q, K, V,
output) and four backward (their gradients), each sending ``(N-1)/N`` of the
``b s/N h`` elements it holds: :func:`distlab.calc.comm.ulysses_comm`.
N must divide the number of heads (:meth:`Ulysses.check_heads`).

Either split of :mod:`distlab.parallel.context.ring` works: after the all-to-all a
rank holds every rank's tokens in rank order, and the causal mask is built
from their global positions. Tensors are ``(batch, heads, seq, head_dim)``;
``ContextParallelBlock(dense, Ulysses(group), seq_len=s)`` is a GPT block
with Ulysses attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distlab.collectives import all_to_all
from distlab.parallel.comm.trace import traced
from distlab.parallel.context.ring import ContextGroup, causal_attention_at


@dataclass
class Ulysses(ContextGroup):
    """A context-parallel group that attends by all-to-all (DeepSpeed-Ulysses).

    ``messages`` counts all-to-all calls by phase, ``bytes_sent`` the bytes this
    rank sent to the other ranks in them, ``kv_bytes_held`` the K/V of its head
    group over the whole sequence (``2 b s h / N`` elements)."""

    def check_heads(self, heads: int) -> None:
        if heads % self.size:
            raise ValueError(
                f"heads={heads} is not divisible by the Ulysses group size N={self.size}: "
                f"each rank attends over heads/N whole heads; choose N dividing the head "
                f"count, or use ring attention or the K/V all-gather"
            )

    def attend(self, q, k, v, seq_len: int) -> torch.Tensor:
        """:func:`ulysses_attention` over this group."""
        return ulysses_attention(q, k, v, self, seq_len)


def exchange(
    x: torch.Tensor, cp: Ulysses, split_dim: int, cat_dim: int, phase: str
) -> torch.Tensor:
    """All-to-all: cut ``x`` into N blocks along ``split_dim``, send block j to rank j,
    and concatenate the blocks received (from ranks 0 .. N-1) along ``cat_dim``."""
    if cp.size == 1:
        return x
    blocks = [block.contiguous() for block in x.chunk(cp.size, split_dim)]
    received = [torch.empty_like(block) for block in blocks]
    with traced("all_to_all", cp.group, x):
        all_to_all(received, blocks, cp.group)
    cp.messages[phase] += 1
    cp.bytes_sent[phase] += sum(
        b.numel() * b.element_size() for j, b in enumerate(blocks) if j != cp.rank
    )
    return torch.cat(received, cat_dim)


class SwapSplit(torch.autograd.Function):
    """Forward: :func:`exchange` from ``split_dim`` to ``cat_dim``. Backward: the
    reverse exchange of the gradient (from ``cat_dim`` back to ``split_dim``)."""

    @staticmethod
    def forward(ctx, x, cp: Ulysses, split_dim: int, cat_dim: int):
        ctx.cp, ctx.dims = cp, (split_dim, cat_dim)
        return exchange(x, cp, split_dim, cat_dim, "forward")

    @staticmethod
    def backward(ctx, grad):
        split_dim, cat_dim = ctx.dims
        return exchange(grad, ctx.cp, cat_dim, split_dim, "backward"), None, None, None


def sequence_to_heads(x: torch.Tensor, cp: Ulysses) -> torch.Tensor:
    """``(b, a, s/N, d)``, this rank's tokens of every head, to ``(b, a/N, s, d)``, its
    head group over every rank's tokens (in rank order)."""
    return SwapSplit.apply(x, cp, 1, 2)


def heads_to_sequence(x: torch.Tensor, cp: Ulysses) -> torch.Tensor:
    """The inverse of :func:`sequence_to_heads`: ``(b, a/N, s, d)`` to ``(b, a, s/N, d)``."""
    return SwapSplit.apply(x, cp, 2, 1)


def ulysses_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: Ulysses, seq_len: int
) -> torch.Tensor:
    """Causal softmax(Q K^T / sqrt(d)) V for this rank's tokens over the whole sequence,
    each argument being this rank's tokens (:func:`~distlab.parallel.context.ring.split_sequence`)."""
    cp.check_shapes(q, k, v, seq_len)
    cp.check_heads(q.shape[1])
    q_all, k_all, v_all = (sequence_to_heads(t, cp) for t in (q, k, v))
    cp.hold(k_all, v_all)
    positions = torch.cat([cp.positions(seq_len, r) for r in range(cp.size)]).to(q.device)
    cp.work += q_all.shape[0] * q_all.shape[1] * seq_len * seq_len
    out = causal_attention_at(q_all, k_all, v_all, positions, positions)
    return heads_to_sequence(out, cp)
