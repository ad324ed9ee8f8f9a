"""How context parallelism cuts a sequence among its ranks: which chunks each rank holds.

The *contiguous* split cuts the sequence into N chunks and gives rank r chunk r; with
causal attention the last rank then attends to N times as many keys as the first. The
*zig-zag* split (Megatron-LM's context parallelism) cuts it into 2N chunks and gives
rank r chunks r and 2N-1-r, an early one and a late one, so every rank does the same
work. Plain Python, so the calculators (:mod:`distlab.calc.run_activations`) and the
ranks (:mod:`distlab.parallel.context.ring`) use the same rule.
"""

from __future__ import annotations

SPLITS = ("contiguous", "zigzag")


def chunks_of(rank: int, cp: int, split: str) -> list[int]:
    """Which of the sequence's chunks rank ``rank`` holds, in order: ``[rank]`` of
    N chunks (contiguous), or ``[rank, 2N-1-rank]`` of 2N chunks (zig-zag)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [rank] if split == "contiguous" else [rank, 2 * cp - 1 - rank]


def chunk_count(cp: int, split: str) -> int:
    """How many chunks the sequence is cut into: N (contiguous) or 2N (zig-zag)."""
    return cp if split == "contiguous" else 2 * cp
