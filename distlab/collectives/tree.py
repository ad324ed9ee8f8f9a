"""Tree algorithms: binomial-tree reduce and broadcast, and NCCL's double binary tree.

**Binomial tree** (Thakur, Rabenseifner & Gropp 2005, Section 4). Number ranks relative
to the root, ``v = (r - root) mod n``. Reduce: in round ``k`` every rank
whose ``v`` has bit ``k`` set as its lowest set bit sends its whole buffer
to ``v - 2^k``, which adds it in; after ``ceil(log2 n)`` rounds the root
holds the sum. Broadcast is the same tree played backwards. Cost of each:
``ceil(log2 n) (alpha + N beta)``: few steps (good for small messages), but
every step moves the whole buffer (bad for large ones).

``tree_all_reduce`` = reduce to rank 0 + broadcast from rank 0:
``2 ceil(log2 n)`` steps.

**Double binary tree** (NCCL 2.4, Sanders, Speck & Träff 2009). Two binary
trees over the same ranks, each carrying half of the data. The second tree
is the first shifted by one rank (or mirrored when ``n`` is odd), so a rank
that is a leaf in one tree is an inner node in the other and no rank does
double work. Each half is reduced up its tree and broadcast down again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.core.collective_schedule import (
    CollectiveSchedule,
    Step,
    Transfer,
    log2_ceil,
    merge_parallel,
)

if TYPE_CHECKING:  # the runner loads torch only when it runs
    from .buffers import Group


def tree_reduce_steps(n: int, root: int, chunks: tuple[int, ...]) -> list[Step]:
    steps = []
    for k in range(log2_ceil(n)):
        step = []
        for v in range(n):
            if v % (2 << k) == (1 << k):  # lowest set bit of v is bit k
                step.append(
                    Transfer((v + root) % n, (v - (1 << k) + root) % n, chunks, reduce=True)
                )
        steps.append(tuple(step))
    return steps


def tree_broadcast_steps(n: int, root: int, chunks: tuple[int, ...]) -> list[Step]:
    steps = []
    for k in reversed(range(log2_ceil(n))):
        step = []
        for v in range(0, n, 2 << k):  # ranks that already hold the data
            if v + (1 << k) < n:
                step.append(
                    Transfer((v + root) % n, (v + (1 << k) + root) % n, chunks, reduce=False)
                )
        steps.append(tuple(step))
    return steps


def tree_reduce_schedule(n: int, root: int = 0) -> CollectiveSchedule:
    return CollectiveSchedule(
        "reduce", "tree", n, 1, tuple(tree_reduce_steps(n, root, (0,))), root=root
    )


def tree_broadcast_schedule(n: int, root: int = 0) -> CollectiveSchedule:
    return CollectiveSchedule(
        "broadcast", "tree", n, 1, tuple(tree_broadcast_steps(n, root, (0,))), root=root
    )


def tree_all_reduce_schedule(n: int) -> CollectiveSchedule:
    steps = tree_reduce_steps(n, 0, (0,)) + tree_broadcast_steps(n, 0, (0,))
    return CollectiveSchedule("all_reduce", "tree", n, 1, tuple(steps))


# ------------------------------------------------------- double binary tree ----
def binary_tree_parents(n: int) -> dict[int, int]:
    """Parent of each rank in NCCL's binary tree (the root, rank 0, has none).

    A rank's level is its lowest set bit: odd ranks are leaves, rank 2 and 6
    are one level up, and so on, as in an in-order numbered complete tree.
    """
    parents = {}
    for r in range(1, n):
        low = r & -r  # lowest set bit
        up = (r ^ low) | (low << 1)  # the parent one level up, in order
        if up >= n:  # that slot does not exist: attach to the next level's node
            up = r ^ low
        parents[r] = up
    return parents


def _shifted_tree(n: int) -> dict[int, int]:
    """The second tree: the first shifted by one rank (n even) or mirrored (n odd)."""
    base = binary_tree_parents(n)
    if n % 2 == 0:
        relabel = {r: (r + 1) % n for r in range(n)}
    else:
        relabel = {r: n - 1 - r for r in range(n)}
    return {relabel[child]: relabel[parent] for child, parent in base.items()}


def _tree_steps(parents: dict[int, int], chunk: int) -> tuple[list[Step], list[Step]]:
    """Reduce-up steps (children send when their subtree is done) and broadcast-down steps."""
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)

    def height(r: int) -> int:
        return 1 + max((height(c) for c in children.get(r, [])), default=-1)

    def depth(r: int) -> int:
        return 0 if r not in parents else 1 + depth(parents[r])

    up: dict[int, list[Transfer]] = {}
    down: dict[int, list[Transfer]] = {}
    for child, parent in parents.items():
        up.setdefault(height(child), []).append(Transfer(child, parent, (chunk,), reduce=True))
        down.setdefault(depth(child) - 1, []).append(
            Transfer(parent, child, (chunk,), reduce=False)
        )
    reduce_steps = [tuple(up.get(h, [])) for h in range(max(up, default=-1) + 1)]
    broadcast_steps = [tuple(down.get(d, [])) for d in range(max(down, default=-1) + 1)]
    return reduce_steps, broadcast_steps


def double_binary_tree_all_reduce_schedule(n: int) -> CollectiveSchedule:
    """Half the buffer (chunk 0) goes up and down tree A, the other half (chunk 1) tree B."""
    up_a, down_a = _tree_steps(binary_tree_parents(n), 0)
    up_b, down_b = _tree_steps(_shifted_tree(n), 1)
    steps = merge_parallel(up_a, up_b) + merge_parallel(down_a, down_b)
    return CollectiveSchedule(
        "all_reduce", "double_binary_tree", n, 2, tuple(s for s in steps if s)
    )


# ---- run on real processes (torch is imported only when a collective runs) ----
def tree_reduce(tensor, dst: int = 0, op="sum", group: Group = None) -> None:
    """Reduce ``tensor`` onto rank ``dst`` with a binomial tree (like ``torch.distributed.reduce``).

    Only ``dst``'s tensor holds the result; the others hold partial sums.
    """
    from . import api

    api.rooted(tree_reduce_schedule, "tree_reduce", tensor, dst, op, group, reduces=True)


def tree_broadcast(tensor, src: int = 0, group: Group = None) -> None:
    """Broadcast ``tensor`` from rank ``src`` with a binomial tree (like ``torch.distributed.broadcast``)."""
    from . import api

    api.rooted(tree_broadcast_schedule, "tree_broadcast", tensor, src, None, group, reduces=False)


def tree_all_reduce(tensor, op="sum", group: Group = None) -> None:
    """All-reduce in place: binomial-tree reduce to rank 0, then broadcast back."""
    from . import api

    api.all_reduce(tree_all_reduce_schedule, "tree_all_reduce", tensor, op, group)


def double_binary_tree_all_reduce(tensor, op="sum", group: Group = None) -> None:
    """All-reduce in place with two complementary binary trees, half the data on each (NCCL's tree)."""
    from . import api

    api.all_reduce(
        double_binary_tree_all_reduce_schedule, "double_binary_tree_all_reduce", tensor, op, group
    )
