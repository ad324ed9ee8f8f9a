"""Dropout under tensor parallelism: which ranks must draw the same mask (Megatron's RNG tracker).

A tensor-parallel layer holds two kinds of activations:

* **replicated** ones (the residual stream, the outputs of ``g``): every rank
  of the group holds the same tensor, so its dropout mask must be the **same**
  on every rank, or the copies drift apart and the ranks train different models;
* **sharded** ones (the attention probabilities of this rank's ``a/t`` heads;
  with sequence parallelism also the residual stream's ``s/t`` tokens): each
  rank holds a different slice of one dense tensor, so its mask must be a
  **different** draw, as the dense model's mask is different across those
  slices. The same seed would drop the same positions in every slice.

Megatron-LM (Shoeybi et al. 2019, Section 3; ``tensor_parallel/random.py``)
keeps two random streams per rank: the default one, seeded alike on every
tensor-parallel rank, and a tracked one seeded ``seed + 2718 + tp_rank``;
dropout inside the parallel region runs under ``tracker.fork()``, which swaps
the tracked state in and out. :class:`RNGTracker` is that, for the CPU
generator (and the current CUDA device's, once CUDA is in use).

Selective recomputation (``torch.utils.checkpoint``) stores the random state
when the checkpointed forward starts and restores it to recompute: forking
*around* the checkpoint makes it store the tracked state, so the recomputed
mask is the one drawn in forward.

:func:`tensor_parallel_masks` draws, in one process, the masks a ``t``-rank
:class:`~distlab.parallel.tensor.layers.ParallelBlock` draws, and
:func:`block_with_masks` runs the dense block with them: the reference that
proves a tensor-parallel block with dropout equal to the dense one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from distlab.models import GPTBlock

#: Megatron-LM's offset between the default seed and the tensor-parallel one
TP_SEED_OFFSET = 2718


def tensor_parallel_seed(seed: int, tp_rank: int) -> int:
    """The tracked stream's seed on tensor-parallel rank ``tp_rank``: ``seed + 2718 + tp_rank``."""
    return seed + TP_SEED_OFFSET + tp_rank


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _current_states() -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state() if _cuda_in_use() else None


def _set_states(states: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1])


class RNGTracker:
    """A second random stream for the tensor-parallel region, one per rank.

    ``RNGTracker(seed, tp_rank)`` seeds the tracked stream with
    :func:`tensor_parallel_seed`; :meth:`seed_default` seeds the default stream
    with ``seed`` itself (the same on every rank of the group). Inside
    ``with tracker.fork():`` every random draw (``torch.native_dropout``
    included) comes from the tracked stream, which continues where it stopped
    last time; outside, the default stream is untouched by what ran inside.
    """

    def __init__(self, seed: int, tp_rank: int) -> None:
        if not isinstance(seed, int) or not isinstance(tp_rank, int) or tp_rank < 0:
            raise ValueError(
                f"seed and tp_rank must be integers, tp_rank >= 0: got {seed!r}, {tp_rank!r}"
            )
        self.seed, self.tp_rank = seed, tp_rank
        self.parallel_seed = tensor_parallel_seed(seed, tp_rank)
        devices = [torch.cuda.current_device()] if _cuda_in_use() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.parallel_seed)
            self._states = _current_states()

    def seed_default(self) -> None:
        """Seed the default stream with ``seed``: call it on every rank of the group."""
        torch.manual_seed(self.seed)

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        """Draw from the tracked stream inside the block, then put the default one back."""
        default = _current_states()
        _set_states(self._states)
        try:
            yield
        finally:
            self._states = _current_states()
            _set_states(default)

    @contextlib.contextmanager
    def replay(self, states: tuple[torch.Tensor, torch.Tensor | None]) -> Iterator[None]:
        """Inside the block the tracked stream starts from ``states`` (taken earlier with
        :attr:`states`); afterwards it is where it was. Full recomputation replays a
        block's forward in backward: the tracked draws must be the forward's again."""
        now = self._states
        self._states = states
        try:
            yield
        finally:
            self._states = now

    @property
    def states(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Where the tracked stream is now (for :meth:`replay`)."""
        return self._states


def parallel_region(rng: RNGTracker | None):
    """``rng.fork()``, or nothing when there is no tracker (every draw from the default stream)."""
    return contextlib.nullcontext() if rng is None else rng.fork()


def dropout_masks(shapes: list[tuple[int, ...]], p: float, seed: int) -> list[torch.Tensor]:
    """The boolean masks ``torch.native_dropout`` keeps for tensors of ``shapes``, drawn one
    after another from a stream seeded with ``seed`` (True: kept, then scaled by 1/(1-p))."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [torch.native_dropout(torch.ones(shape), p, True)[1] for shape in shapes]


def tensor_parallel_masks(
    block: GPTBlock,
    batch: int,
    seq_len: int,
    *,
    tp: int,
    seed: int,
    tracker: bool = True,
    sequence_parallel: bool = False,
) -> dict[str, torch.Tensor]:
    """The dropout masks of the dense ``block`` that a ``tp``-rank ``ParallelBlock`` draws.

    ``"attn"`` (attention probabilities, ``(b, a, s, s)``): rank r's ``a/t`` heads
    from its tracked stream, or, with ``tracker=False``, every rank the same draw
    from the default stream. ``"proj"`` and ``"mlp"`` (the residual branch outputs,
    ``(b, s, h)``): from the default stream, after the attention mask when that
    came from it too; with ``sequence_parallel`` rank r's ``s/t`` tokens from its
    tracked stream, after its attention mask.
    """
    heads, hidden = block.attn.heads // tp, block.attn.heads * block.attn.head_dim
    attn_shape = (batch, heads, seq_len, seq_len)
    residual = (batch, seq_len // tp if sequence_parallel else seq_len, hidden)
    p = block.attn.dropout
    if not tracker:
        attn, proj, mlp = dropout_masks([attn_shape, residual, residual], p, seed)
        return {"attn": torch.cat([attn] * tp, 1), "proj": proj, "mlp": mlp}
    parallel = [
        dropout_masks([attn_shape, residual, residual], p, tensor_parallel_seed(seed, r))
        for r in range(tp)
    ]
    masks = {"attn": torch.cat([m[0] for m in parallel], 1)}
    if sequence_parallel:
        masks["proj"] = torch.cat([m[1] for m in parallel], 1)
        masks["mlp"] = torch.cat([m[2] for m in parallel], 1)
    else:
        masks["proj"], masks["mlp"] = dropout_masks([residual, residual], p, seed)
    return masks


def block_with_masks(
    block: GPTBlock, x: torch.Tensor, masks: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The dense block's forward (:class:`~distlab.models.GPTBlock`) with its three
    dropouts applied as ``masks`` (:func:`tensor_parallel_masks`) instead of drawn."""
    attn, mlp, p = block.attn, block.mlp, block.attn.dropout
    b, s, hidden = x.shape
    h = block.ln1(x)
    q, k, v = (attn._split(layer(h)) for layer in (attn.q, attn.k, attn.v))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(attn.head_dim)) + attn.mask[:s, :s]
    probs = scores.softmax(-1) * masks["attn"] / (1 - p)
    out = (probs @ v).transpose(1, 2).reshape(b, s, hidden)
    x = x + attn.proj(out) * masks["proj"] / (1 - p)
    return x + mlp.fc2(F.gelu(mlp.fc1(block.ln2(x)))) * masks["mlp"] / (1 - p)
