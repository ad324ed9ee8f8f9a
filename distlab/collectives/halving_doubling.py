"""Recursive halving-doubling all-reduce (Rabenseifner's algorithm).

For ``p`` a power of two, cut the buffer into ``p`` chunks and:

1. **Recursive halving reduce-scatter**, ``log2 p`` steps: pair each rank
   with the rank ``p/2`` away; each keeps one half of its range and sends
   the other half to its partner, who adds it in. Then pair ranks ``p/4``
   away on the half, and so on. Afterwards rank ``j`` owns chunk ``j``, fully
   reduced, having sent ``N/2 + N/4 + ... = (p - 1)/p N`` bytes.
2. **Recursive doubling all-gather**, ``log2 p`` steps: the same exchanges in
   reverse order, each rank doubling the range it holds.

Cost: ``2 log2(p) alpha + 2 (p - 1)/p N beta``: the ring's bandwidth with
only ``2 log2 p`` latency terms (Thakur, Rabenseifner & Gropp 2005, Sec. 4.5).

When ``n`` is not a power of two, let ``p`` be the largest power of two below
``n`` and ``extra = n - p``. First the ranks ``0 .. 2*extra - 1`` fold in
pairs: each even rank sends its whole buffer to the next odd rank, which
adds it; now ``p`` ranks hold all the data and run the algorithm above; at
the end each odd rank copies the result back to its even partner. Two more
steps, each moving ``N``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.core.collective_schedule import CollectiveSchedule, Transfer

if TYPE_CHECKING:  # the runner loads torch only when it runs
    from .buffers import Group


def halving_doubling_all_reduce_schedule(n: int) -> CollectiveSchedule:
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n
    extra = n - p
    everything = tuple(range(p))
    # Participants after folding: the odd ranks of the first 2*extra, then the rest.
    members = [2 * i + 1 for i in range(extra)] + list(range(2 * extra, n))

    steps = []
    if extra:
        steps.append(
            tuple(Transfer(2 * i, 2 * i + 1, everything, reduce=True) for i in range(extra))
        )

    # Recursive halving: ranges[j] is the run of chunks member j is responsible for.
    ranges = {j: (0, p) for j in range(p)}
    distance = p // 2
    while distance >= 1:
        step = []
        for j in range(p):
            partner = j ^ distance
            lo, hi = ranges[j]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if j & distance == 0 else ((mid, hi), (lo, mid))
            step.append(Transfer(members[j], members[partner], tuple(range(*give)), reduce=True))
            ranges[j] = keep
        steps.append(tuple(step))
        distance //= 2

    # Recursive doubling: exchange owned ranges with partners 1, 2, 4, ... away.
    distance = 1
    while distance < p:
        step = []
        for j in range(p):
            partner = j ^ distance
            step.append(
                Transfer(members[j], members[partner], tuple(range(*ranges[j])), reduce=False)
            )
        ranges = {
            j: (
                min(ranges[j][0], ranges[j ^ distance][0]),
                max(ranges[j][1], ranges[j ^ distance][1]),
            )
            for j in range(p)
        }
        steps.append(tuple(step))
        distance *= 2

    if extra:
        steps.append(
            tuple(Transfer(2 * i + 1, 2 * i, everything, reduce=False) for i in range(extra))
        )
    return CollectiveSchedule("all_reduce", "halving_doubling", n, p, tuple(steps))


def halving_doubling_all_reduce(tensor, op="sum", group: Group = None) -> None:
    """All-reduce in place with recursive halving-doubling (Rabenseifner); any world size."""
    from . import api

    api.all_reduce(
        halving_doubling_all_reduce_schedule, "halving_doubling_all_reduce", tensor, op, group
    )
