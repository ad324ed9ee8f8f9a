"""The parameter-server baseline: everyone sends everything to rank 0, rank 0 sends the sum back.

Step 1: all ``n - 1`` other ranks send their whole buffer to rank 0, which
adds them up. Step 2: rank 0 sends the result to each of them. Only two
steps, but rank 0's link carries ``(n - 1) N`` bytes each way while the
others idle: time ``2 (n - 1) N beta`` grows with ``n``, which is why
parameter servers gave way to ring and tree all-reduce (Sergeev & Del Balso
2018, the Horovod paper, abstract: communication overhead is why it moves
TensorFlow's data parallelism to ring all-reduce).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.core.collective_schedule import CollectiveSchedule, Transfer

if TYPE_CHECKING:  # the runner loads torch only when it runs
    from .buffers import Group


def naive_all_reduce_schedule(n: int) -> CollectiveSchedule:
    gather = tuple(Transfer(r, 0, (0,), reduce=True) for r in range(1, n))
    scatter_back = tuple(Transfer(0, r, (0,), reduce=False) for r in range(1, n))
    steps = tuple(s for s in (gather, scatter_back) if s)
    return CollectiveSchedule("all_reduce", "naive", n, 1, steps)


def naive_all_reduce(tensor, op="sum", group: Group = None) -> None:
    """All-reduce in place through rank 0 (gather and reduce, then send back)."""
    from . import api

    api.all_reduce(naive_all_reduce_schedule, "naive_all_reduce", tensor, op, group)
