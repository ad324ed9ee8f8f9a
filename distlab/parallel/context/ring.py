"""Context parallelism: causal attention over a sequence split across ranks (ring attention).

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", abstract. Each of N ranks holds s/N tokens of Q, K
and V. The K/V blocks travel around a ring: at each of N steps a rank
attends its queries to the block it holds, then sends that block to the next
rank and receives one from the previous: N-1 point-to-point messages per
pass (and N-1 more in backward, carrying the K/V gradients home).

The partial results are combined with the online softmax (Milakov &
Gimelshein 2018; FlashAttention, Dao et al. 2022, Section 3.1). For each query
row with running max m, running sum l and running output o, a new block of
scores S and values V updates::

    m' = max(m, rowmax S)
    l' = l e^(m - m') + rowsum e^(S - m')
    o' = o e^(m - m') + e^(S - m') V          output = o / l   (after the last block)

m only keeps the exponentials in range (the result does not depend on it),
so it is detached from autograd, and autograd differentiates the rest.

Causality makes the work uneven. With the *contiguous* split rank r holds
tokens [r s/N, (r+1) s/N) and attends to r+1 blocks, so the last rank works
N times as long as the first. The *zig-zag* split (Megatron-LM context
parallelism; Brandon et al. 2023 "Striped Attention", abstract, is the strided
variant: each rank holds tokens spread evenly over the whole sequence)
cuts the sequence into 2N chunks and gives rank r chunks r and 2N-1-r: every
rank then computes 2N+1 quarter-size blocks. Blocks entirely in the future
are skipped, and :attr:`Ring.work` counts the score elements each rank
really computes.

Tensors are ``(batch, heads, seq, head_dim)``.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from distlab.collectives.buffers import global_rank
from distlab.core.sequence_split import chunk_count, chunks_of
from distlab.models import GPTBlock, dropout
from distlab.parallel.comm.collectives import Collectives
from distlab.parallel.comm.trace import record_p2p


def local_positions(seq_len: int, cp: int, rank: int, split: str) -> torch.Tensor:
    """The global positions of the tokens rank ``rank`` holds."""
    n = chunk_count(cp, split)
    if seq_len % n:
        raise ValueError(
            f"seq_len={seq_len} must be divisible by {n} for the {split} split over cp={cp} ranks"
        )
    size = seq_len // n
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks_of(rank, cp, split)])


def split_sequence(x: torch.Tensor, dim: int, cp: int, rank: int, split: str) -> torch.Tensor:
    """This rank's tokens of ``x`` (sequence along ``dim``)."""
    return x.index_select(dim, local_positions(x.shape[dim], cp, rank, split).to(x.device))


@dataclass
class ContextGroup:
    """The context-parallel group of this rank, its split of the sequence, and what
    this rank sent (``messages``/``bytes_sent`` by phase), computed (``work``:
    attention score elements in forward) and held (``kv_bytes_held``: the most K/V
    bytes of communication buffers alive at once in forward).

    The three ways to run attention over the group are its subclasses, each with
    an :meth:`attend`: :class:`Ring` (ring attention, here),
    :class:`~distlab.parallel.context.gather.KVGather` (all-gather K/V, Llama 3)
    and :class:`~distlab.parallel.context.ulysses.Ulysses` (all-to-all, DeepSpeed-Ulysses).
    """

    group: object = None
    split: str = "contiguous"
    messages: Counter = field(default_factory=Counter)
    bytes_sent: Counter = field(default_factory=Counter)
    work: int = 0
    kv_bytes_held: int = 0

    def __post_init__(self) -> None:
        chunks_of(0, 1, self.split)  # validates split
        if not dist.is_initialized():
            raise RuntimeError("no process group: use inside distlab.run(...) or after init()")
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        if self.rank < 0:
            raise ValueError(
                f"rank {dist.get_rank()} is not in the context-parallel group "
                f"{dist.get_process_group_ranks(self.group)}"
            )

    def positions(self, seq_len: int, rank: int | None = None) -> torch.Tensor:
        """The global positions of the tokens group rank ``rank`` (default: this one) holds."""
        return local_positions(seq_len, self.size, self.rank if rank is None else rank, self.split)

    def check_shapes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int):
        """This rank's positions, after checking that q, k, v hold exactly its tokens."""
        mine = self.positions(seq_len).to(q.device)
        if q.shape[2] != mine.numel() or k.shape != q.shape or v.shape != q.shape:
            raise ValueError(
                f"q, k, v must each hold this rank's {mine.numel()} tokens of seq_len={seq_len}: "
                f"got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        return mine

    def check_heads(self, heads: int) -> None:
        """Raise ``ValueError`` if attention with ``heads`` heads cannot run here (any count can
        for the ring and the all-gather; Ulysses needs a multiple of the group size)."""

    def hold(self, *buffers: torch.Tensor) -> None:
        """Note K/V buffers alive at the same time (for ``kv_bytes_held``)."""
        held = sum(t.numel() * t.element_size() for t in buffers)
        self.kv_bytes_held = max(self.kv_bytes_held, held)

    def attend(self, q, k, v, seq_len: int) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no attention")


@dataclass
class Ring(ContextGroup):
    """The context-parallel group as a ring: who to send to (``next``) and receive
    from (``prev``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.next = global_rank(self.group, (self.rank + 1) % self.size)
        self.prev = global_rank(self.group, (self.rank - 1) % self.size)

    def shift(self, x: torch.Tensor, phase: str, *, backwards: bool = False) -> torch.Tensor:
        """Send ``x`` one step along the ring (to ``next``; to ``prev`` if
        ``backwards``) and return what arrives from the other side."""
        dst, src = (self.prev, self.next) if backwards else (self.next, self.prev)
        x = x.contiguous()
        received = torch.empty_like(x)
        ops = [
            dist.P2POp(dist.isend, x, dst, self.group),
            dist.P2POp(dist.irecv, received, src, self.group),
        ]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        record_p2p("send", "cp", self.size, x)
        record_p2p("recv", "cp", self.size, received)
        self.messages[phase] += 1
        self.bytes_sent[phase] += x.numel() * x.element_size()
        if phase == "forward":
            self.hold(x, received)
        return received

    def attend(self, q, k, v, seq_len: int) -> torch.Tensor:
        """:func:`ring_attention` on this ring."""
        return ring_attention(q, k, v, self, seq_len)


class RingPass(torch.autograd.Function):
    """Forward: send this K/V block to the next rank, receive the previous rank's.
    Backward: the gradient goes the other way round the ring."""

    @staticmethod
    def forward(ctx, kv, ring: Ring):
        ctx.ring = ring
        return ring.shift(kv, "forward")

    @staticmethod
    def backward(ctx, grad):
        return ctx.ring.shift(grad, "backward", backwards=True), None


def _pieces(positions: torch.Tensor, n: int) -> list[tuple[int, torch.Tensor]]:
    """(local offset, global positions) of each of the ``n`` equal chunks held."""
    size = positions.numel() // n
    return [(i * size, positions[i * size : (i + 1) * size]) for i in range(n)]


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, seq_len: int
) -> torch.Tensor:
    """Causal softmax(Q K^T / sqrt(d)) V for this rank's queries over the whole
    sequence, each argument being this rank's tokens (``split_sequence``)."""
    n_chunks = len(chunks_of(ring.rank, ring.size, ring.split))
    mine = ring.check_shapes(q, k, v, seq_len)
    scale = 1.0 / math.sqrt(q.shape[-1])
    shape = (*q.shape[:2], mine.numel() // n_chunks, 1)
    state = [
        [torch.full(shape, -math.inf, dtype=q.dtype, device=q.device), q.new_zeros(shape), None]
        for _ in range(n_chunks)
    ]  # per query chunk: running max m, running sum l, running output o
    kv = torch.stack([k, v])  # one message per step
    ring.hold(kv)
    for step in range(ring.size):
        owner = (ring.rank - step) % ring.size
        theirs = local_positions(seq_len, ring.size, owner, ring.split).to(q.device)
        for (qo, qpos), st in zip(_pieces(mine, n_chunks), state, strict=True):
            for ko, kpos in _pieces(theirs, n_chunks):
                if kpos[0] > qpos[-1]:
                    continue  # entirely in the future of these queries
                q_i = q[:, :, qo : qo + qpos.numel()]
                k_j, v_j = kv[0][:, :, ko : ko + kpos.numel()], kv[1][:, :, ko : ko + kpos.numel()]
                scores = (q_i @ k_j.transpose(-2, -1)) * scale
                scores = scores.masked_fill(kpos[None, :] > qpos[:, None], -math.inf)
                ring.work += scores.numel()
                with torch.no_grad():  # m only keeps exp in range: no gradient, nothing kept
                    m_new = torch.maximum(st[0], scores.amax(-1, keepdim=True))
                decay, p = torch.exp(st[0] - m_new), torch.exp(scores - m_new)
                st[1] = st[1] * decay + p.sum(-1, keepdim=True)
                st[2] = p @ v_j if st[2] is None else st[2] * decay + p @ v_j
                st[0] = m_new
        if step < ring.size - 1:
            kv = RingPass.apply(kv, ring)
    out = torch.cat([o / l for _, l, o in state], dim=2)
    # Every rank must run every backward message, also for a block it skipped
    # (causal): tie the last block in with weight zero, so autograd walks the whole
    # chain of passes and sends (zero) gradients where the peers expect them.
    return out + 0.0 * kv.sum()


def causal_attention_at(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d), keys after the query masked) V, with the global
    sequence positions of the queries and of the keys given (in any order): the
    local attention of the all-gather and Ulysses variants, and of the dense reference."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    future = k_positions[None, :] > q_positions[:, None]
    return scores.masked_fill(future, -math.inf).softmax(-1) @ v


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The single-process reference: softmax(Q K^T / sqrt(d) + causal mask) V."""
    positions = torch.arange(q.shape[2], device=q.device)
    return causal_attention_at(q, k, v, positions, positions)


class ContextParallelBlock(nn.Module):
    """A :class:`~distlab.models.GPTBlock` on this rank's tokens, attention over the group.

    ``cp`` is a :class:`ContextGroup` and says how attention reaches the other
    ranks' tokens: a :class:`Ring` (ring attention), a
    :class:`~distlab.parallel.context.gather.KVGather` (all-gather K/V) or a
    :class:`~distlab.parallel.context.ulysses.Ulysses` (all-to-all to heads and back).
    Every weight is replicated (as in data parallelism); only attention needs
    the other ranks' tokens. Each rank's weight gradients cover its tokens, so
    :meth:`finish_gradients` sums them over the group (Megatron-LM reduces
    gradients over the combined data x context parallel group). Attention
    dropout is not supported (``dense.attn.dropout`` must be 0).
    """

    def __init__(self, dense: GPTBlock, cp: ContextGroup, *, seq_len: int, algorithm: str = "ring"):
        super().__init__()
        if dense.attn.dropout:
            raise ValueError(f"attention dropout must be 0 here, got {dense.attn.dropout}")
        cp.positions(seq_len)  # validates seq_len
        cp.check_heads(dense.attn.heads)
        self.block, self.cp, self.seq_len = copy.deepcopy(dense), cp, seq_len
        self.comm = Collectives(algorithm=algorithm, group=cp.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn = self.block.attn
        h = self.block.ln1(x)
        q, k, v = (attn._split(layer(h)) for layer in (attn.q, attn.k, attn.v))
        out = self.cp.attend(q, k, v, self.seq_len).transpose(1, 2).reshape(x.shape)
        x = x + dropout(attn.proj(out), attn.dropout, self.training)
        return x + self.block.mlp(self.block.ln2(x))

    def finish_gradients(self) -> None:
        """Sum every weight gradient over the context-parallel group (one flat all-reduce)."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.comm.all_reduce_sum_(flat)
            for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(part.view_as(g))
