"""Ring reduce-scatter, all-gather and all-reduce.

The ranks form a ring ``0 -> 1 -> ... -> n-1 -> 0`` and the buffer is cut
into ``n`` chunks.

* **Reduce-scatter**, ``n - 1`` steps: in step ``s`` rank ``r`` sends chunk
  ``(r - s - 1) mod n`` to rank ``r + 1``, which adds it to its own copy.
  Chunk ``c`` starts at rank ``c + 1``, picks up one contribution per hop,
  and after ``n - 1`` hops arrives complete at rank ``c``.
* **All-gather**, ``n - 1`` steps: rank ``r`` starts with chunk ``r``; in step
  ``s`` it forwards chunk ``(r - s) mod n`` to rank ``r + 1``.
* **All-reduce** = reduce-scatter, then all-gather: ``2(n - 1)`` steps.

Every rank sends ``2(n - 1)/n * N`` bytes for an ``N``-byte all-reduce, which
is the lower bound for any all-reduce algorithm (Patarasuk & Yuan 2009, abstract:
a tight lower bound on the data sent, met by their ring), so
the ring is *bandwidth optimal*; its ``2(n - 1)`` latency terms are its
weakness for small messages. Cost (Thakur, Rabenseifner & Gropp 2005, Section 4):
``2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from distlab.core.collective_schedule import CollectiveSchedule, Step, Transfer

if TYPE_CHECKING:  # the runner loads torch only when it runs
    from .buffers import Group


def ring_reduce_scatter_steps(ring: Sequence[int], blocks: Sequence[tuple[int, ...]]) -> list[Step]:
    """Reduce-scatter around ``ring`` (rank ids in ring order); ``blocks[i]``
    is the run of chunks that ends up fully reduced on ``ring[i]``."""
    n = len(ring)
    return [
        tuple(
            Transfer(ring[i], ring[(i + 1) % n], blocks[(i - s - 1) % n], reduce=True)
            for i in range(n)
        )
        for s in range(n - 1)
    ]


def ring_all_gather_steps(ring: Sequence[int], blocks: Sequence[tuple[int, ...]]) -> list[Step]:
    """All-gather around ``ring``; ``ring[i]`` starts with ``blocks[i]``."""
    n = len(ring)
    return [
        tuple(
            Transfer(ring[i], ring[(i + 1) % n], blocks[(i - s) % n], reduce=False)
            for i in range(n)
        )
        for s in range(n - 1)
    ]


def _one_chunk_each(n: int) -> list[tuple[int, ...]]:
    return [(i,) for i in range(n)]


def ring_reduce_scatter_schedule(n: int) -> CollectiveSchedule:
    steps = ring_reduce_scatter_steps(range(n), _one_chunk_each(n))
    return CollectiveSchedule("reduce_scatter", "ring", n, n, tuple(steps))


def ring_all_gather_schedule(n: int) -> CollectiveSchedule:
    steps = ring_all_gather_steps(range(n), _one_chunk_each(n))
    return CollectiveSchedule("all_gather", "ring", n, n, tuple(steps))


def ring_all_reduce_schedule(n: int) -> CollectiveSchedule:
    blocks = _one_chunk_each(n)
    steps = ring_reduce_scatter_steps(range(n), blocks) + ring_all_gather_steps(range(n), blocks)
    return CollectiveSchedule("all_reduce", "ring", n, n, tuple(steps))


# ---- run on real processes (torch is imported only when a collective runs) ----
def ring_all_reduce(tensor, op="sum", group: Group = None) -> None:
    """All-reduce ``tensor`` in place with the ring algorithm.

    Same contract as ``torch.distributed.all_reduce(tensor, op, group)``;
    ``op`` is a ``ReduceOp`` (SUM, AVG, PRODUCT, MAX, MIN) or its name.
    """
    from . import api

    api.all_reduce(ring_all_reduce_schedule, "ring_all_reduce", tensor, op, group)


def ring_reduce_scatter(output, input, op="sum", group: Group = None) -> None:
    """Reduce-scatter with the ring: rank ``r``'s ``output`` gets block ``r`` reduced.

    ``input``: a tensor of ``world_size * output.numel()`` elements, or a list
    with one tensor per rank (like ``reduce_scatter_tensor`` / ``reduce_scatter``).
    """
    from . import api

    api.reduce_scatter(
        ring_reduce_scatter_schedule, "ring_reduce_scatter", output, input, op, group
    )


def ring_all_gather(output, input, group: Group = None) -> None:
    """All-gather with the ring: ``output`` (one tensor, or a list of one per rank)
    gets every rank's ``input`` in rank order."""
    from . import api

    api.all_gather(ring_all_gather_schedule, "ring_all_gather", output, input, group)
