"""Context parallelism: one sequence split across ranks, attention still exact (notebook 07).

Three ways to attend over a split sequence; read in this order:

===========  ======================================================================
``ring``     the split (zig-zag, so causal work is even) and ring attention: K/V
             blocks passed round the ring, each rank folding one block per step into
             an online softmax
``gather``   all-gather every rank's K and V once, then attend locally (Llama 3)
``ulysses``  all-to-all from sequence-split to head-split and back (DeepSpeed-Ulysses)
===========  ======================================================================

Each is a strategy object with the same interface (:class:`Ring`, :class:`KVGather`,
:class:`Ulysses`), so :class:`ContextParallelBlock` and the composed GPT take any of
them. Sequence parallelism, which splits only the non-attention parts, is
:mod:`distlab.parallel.tensor.sequence`.
"""

from __future__ import annotations

from .gather import KVGather, all_gather_attention
from .ring import (
    ContextGroup,
    ContextParallelBlock,
    Ring,
    RingPass,
    causal_attention_at,
    dense_causal_attention,
    local_positions,
    ring_attention,
    split_sequence,
)
from .ulysses import Ulysses, sequence_to_heads, ulysses_attention

__all__ = [
    "ContextGroup",
    "ContextParallelBlock",
    "KVGather",
    "Ring",
    "RingPass",
    "Ulysses",
    "all_gather_attention",
    "causal_attention_at",
    "dense_causal_attention",
    "local_positions",
    "ring_attention",
    "sequence_to_heads",
    "split_sequence",
    "ulysses_attention",
]
