"""Split the data between data-parallel ranks, the way ``DistributedSampler`` does.

Why a split is needed: every rank runs the same code. If each rank read the
whole dataset in the same order, all K ranks would compute the same gradient
on the same samples; averaging K equal gradients changes nothing, so K
processes would do the work of one, K times over. Giving rank ``r`` a
different 1/K of each global batch makes the averaged gradient the gradient
of the whole batch: K times the samples per step for the same time.

The rule (``torch.utils.data.DistributedSampler``): optionally shuffle the
indices with a generator seeded by ``seed + epoch`` (the same permutation on
every rank, so the slices do not overlap), pad by repeating indices from the
start until the count divides by K (or drop the tail with ``drop_last``),
then rank ``r`` takes every K-th index starting at ``r``. Call
``set_epoch(e)`` each epoch, or every epoch repeats the same order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from distlab.core.checks import nonnegative_int, positive_int


def shard_indices(
    n_samples: int,
    rank: int,
    world_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> list[int]:
    """The sample indices rank ``rank`` of ``world_size`` reads (DistributedSampler's rule)."""
    n_samples = nonnegative_int("n_samples", n_samples)
    world_size = positive_int("world_size", world_size)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n_samples, generator=g).tolist()
    else:
        order = list(range(n_samples))
    if drop_last:
        per_rank = n_samples // world_size
        order = order[: per_rank * world_size]
    else:
        per_rank = math.ceil(n_samples / world_size)
        padding = per_rank * world_size - n_samples
        while padding > 0 and order:  # repeat from the start (several times if n < K)
            order += order[:padding]
            padding = per_rank * world_size - len(order)
    return order[rank::world_size]


class ShardSampler(torch.utils.data.Sampler):
    """A sampler for ``DataLoader`` that yields :func:`shard_indices` (with ``set_epoch``)."""

    def __init__(
        self,
        n_samples: int,
        rank: int,
        world_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        self.n_samples, self.rank, self.world_size = n_samples, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        shard_indices(n_samples, rank, world_size)  # validates the arguments

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())

    def _indices(self) -> list[int]:
        return shard_indices(
            self.n_samples,
            self.rank,
            self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
            drop_last=self.drop_last,
        )


def shard_batch(batch: torch.Tensor | Sequence[torch.Tensor], rank: int, world_size: int):
    """This rank's part of a global batch (a tensor or a tuple of tensors, batch first).

    The global batch size must divide by ``world_size``: with equal local
    batches, the mean of the per-rank mean losses is the full-batch mean
    loss, so averaged gradients equal the full-batch gradient.
    """
    tensors = [batch] if isinstance(batch, torch.Tensor) else list(batch)
    n = tensors[0].shape[0]
    if n % world_size:
        raise ValueError(
            f"global batch of {n} samples does not divide by world_size {world_size}; "
            "unequal local batches would weight ranks' samples differently"
        )
    index = torch.tensor(shard_indices(n, rank, world_size), dtype=torch.long)
    out = [t.index_select(0, index) for t in tensors]
    return out[0] if isinstance(batch, torch.Tensor) else type(batch)(out)
