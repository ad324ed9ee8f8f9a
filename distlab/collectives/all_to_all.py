"""All-to-all: rank ``r`` sends its ``j``-th block to rank ``j`` and receives rank ``j``'s ``r``-th block.

It is a transpose of the (rank x block) matrix, the collective behind
expert parallelism (tokens routed to the experts that live on other ranks)
and behind Ulysses-style sequence parallelism.

Pairwise-exchange schedule, ``n - 1`` steps after a local copy: in step
``k`` rank ``r`` sends block ``(r + k) mod n`` to rank ``(r + k) mod n`` and
receives from rank ``(r - k) mod n``, so every rank sends and receives
exactly one message per step. Each rank sends ``(n - 1)/n N`` bytes; cost
``(n - 1)(alpha + N/n beta)`` (Thakur, Rabenseifner & Gropp 2005, Sec. 4.6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.core.collective_schedule import CollectiveSchedule, Transfer

if TYPE_CHECKING:  # the runner loads torch only when it runs
    from .buffers import Group


def all_to_all_schedule(n: int) -> CollectiveSchedule:
    keep_own = tuple(Transfer(r, r, (r,), reduce=False) for r in range(n))
    steps = [keep_own]
    for k in range(1, n):
        steps.append(
            tuple(
                Transfer(r, (r + k) % n, ((r + k) % n,), reduce=False, dst_chunks=(r,))
                for r in range(n)
            )
        )
    return CollectiveSchedule("all_to_all", "pairwise", n, n, tuple(steps), out_of_place=True)


def all_to_all(output_tensor_list, input_tensor_list, group: Group = None) -> None:
    """Like ``torch.distributed.all_to_all``: ``output_tensor_list[j]`` receives
    rank ``j``'s ``input_tensor_list[rank]``. Block sizes may differ, but
    rank ``r``'s ``input_tensor_list[j]`` must match rank ``j``'s
    ``output_tensor_list[r]`` (checked on every rank)."""
    from . import api

    api.all_to_all(all_to_all_schedule, "all_to_all", output_tensor_list, input_tensor_list, group)
