"""All-gather context parallelism (Llama 3): gather every rank's K and V once, attend locally.

Dubey et al. 2024, "The Llama 3 Herd of Models", Section 3.3.2. Each of N
ranks holds s/N tokens of Q, K and V (contiguous or zig-zag split, as in
:mod:`distlab.parallel.context.ring`; Llama 3 uses the zig-zag one for balance).
Forward: one all-gather of the stacked K/V over the group, then this
rank's queries attend to the whole sequence with the causal mask at their
global positions. Backward: the gradient of the gathered K/V is
reduce-scattered, so each rank receives the sum of every rank's gradient for
its own tokens (the adjoint of an all-gather).

Against ring attention (:class:`~distlab.parallel.context.ring.Ring`), per layer:

* bytes: the same as distlab's ring, which keeps every K/V block for backward.
  A ring all-gather of N blocks sends N-1 blocks, as the ring does hop by hop;
  the reduce-scatter sends N-1 gradient blocks, as the ring's backward does
  (:func:`distlab.calc.comm.context_parallel_gather_comm`). A fused ring that
  keeps only two blocks passes K/V round again in backward: half as much again
  (:func:`distlab.calc.comm.context_parallel_comm`);
* memory while attention runs forward: the gather holds all N K/V blocks at
  once, the ring two (the block in hand and the one arriving):
  :func:`distlab.calc.comm.context_parallel_kv_bytes`. Saved for backward,
  distlab's ring keeps all N as well; a fused ring kernel keeps its own block;
* overlap: the ring's p2p messages hide behind each block's attention; the
  gather is one collective before any attention, exposed unless it is
  prefetched;
* the gather wins when K/V are small next to Q (grouped-query attention:
  Llama 3 has 8 K/V heads for 128 query heads) and when masks are irregular
  (documents packed into one sequence): the whole K/V is there to mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distlab.collectives.traffic import count_traffic
from distlab.parallel.comm.collectives import Collectives
from distlab.parallel.context.ring import ContextGroup, causal_attention_at


@dataclass
class KVGather(ContextGroup):
    """A context-parallel group that attends by gathering K/V (Llama 3).

    ``algorithm``: distlab's ring collectives (``"ring"``, counted on the wire:
    ``messages`` and ``bytes_sent`` by phase) or ``"builtin"`` (uncounted)."""

    algorithm: str = "ring"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.comm = Collectives(algorithm=self.algorithm, group=self.group)

    def attend(self, q, k, v, seq_len: int) -> torch.Tensor:
        """:func:`all_gather_attention` over this group."""
        return all_gather_attention(q, k, v, self, seq_len)

    def count(self, phase: str, traffic) -> None:
        """Add what one collective put on the wire (nothing on a one-rank group)."""
        if not traffic.messages:
            return
        self.messages[phase] += traffic.messages
        self.bytes_sent[phase] += traffic.bytes_sent


class GatherKV(torch.autograd.Function):
    """Forward: all-gather this rank's K/V into ``(N, *kv.shape)`` (rank order).
    Backward: reduce-scatter the gradient, each rank keeping the sum for its tokens."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor, cp: KVGather) -> torch.Tensor:
        ctx.cp = cp
        gathered = kv.new_empty(cp.size, *kv.shape)
        gathered[cp.rank].copy_(kv)  # in place: the own block is part of the output
        with count_traffic() as traffic:
            cp.comm.all_gather(gathered, gathered[cp.rank])
        cp.count("forward", traffic)
        cp.hold(gathered)
        return gathered

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cp = ctx.cp
        mine = grad.new_empty(grad.shape[1:])
        with count_traffic() as traffic:
            cp.comm.reduce_scatter_sum(mine, grad.contiguous())
        cp.count("backward", traffic)
        return mine, None


def all_gather_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: KVGather, seq_len: int
) -> torch.Tensor:
    """Causal softmax(Q K^T / sqrt(d)) V for this rank's queries over the whole
    sequence, each argument being this rank's tokens (``split_sequence``)."""
    mine = cp.check_shapes(q, k, v, seq_len)
    gathered = GatherKV.apply(torch.stack([k, v]), cp)  # (N, 2, b, a, s/N, d)
    k_all, v_all = torch.cat(gathered.unbind(0), dim=3).unbind(0)  # (b, a, s, d) each
    positions = torch.cat([cp.positions(seq_len, r) for r in range(cp.size)]).to(q.device)
    cp.work += q.shape[0] * q.shape[1] * q.shape[2] * seq_len
    return causal_attention_at(q, k_all, v_all, mine, positions)
