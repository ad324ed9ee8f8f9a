"""Hierarchical (two-level) all-reduce: fast links inside a node, few messages across.

Ranks ``0 .. k-1`` are node 0, ``k .. 2k-1`` node 1, and so on
(``k = ranks_per_node``; the last node may be smaller). Two variants:

* ``"leader"`` (the textbook version): binomial-tree **reduce** inside each
  node onto its first rank (the leader), **ring all-reduce across the
  leaders**, binomial-tree **broadcast** inside each node. Only one rank per
  node touches the slow network, but it carries the whole buffer.
* ``"shard"`` (what NCCL and Horovod do on multi-GPU nodes): ring
  **reduce-scatter** inside each node, so local rank ``g`` owns shard ``g``;
  ``k`` concurrent ring **all-reduces across nodes**, one per shard, among
  the ranks with the same local index; ring **all-gather** inside each node.
  Every NIC carries ``1/k`` of the data. Needs equal-sized nodes.

Inter-node traffic per node: leader ``2 (m - 1)/m N`` through one NIC; shard
the same total spread over ``k`` NICs (``m`` = number of nodes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.core.checks import positive_int
from distlab.core.collective_schedule import CollectiveSchedule, Step, Transfer, merge_parallel

from .ring import ring_all_gather_steps, ring_reduce_scatter_steps
from .tree import tree_broadcast_steps, tree_reduce_steps

if TYPE_CHECKING:  # the runner loads torch only when it runs
    from .buffers import Group


def _relabel(steps: list[Step], ranks: list[int]) -> list[Step]:
    """Map a sub-schedule written for ranks 0..len(ranks)-1 onto ``ranks``."""
    return [
        tuple(Transfer(ranks[t.src], ranks[t.dst], t.chunks, t.reduce, t.dst_chunks) for t in step)
        for step in steps
    ]


def hierarchical_all_reduce_schedule(
    n: int, ranks_per_node: int, variant: str = "leader"
) -> CollectiveSchedule:
    ranks_per_node = positive_int("ranks_per_node", ranks_per_node)
    if variant not in ("leader", "shard"):
        raise ValueError(f"variant must be 'leader' or 'shard', got {variant!r}")
    k = min(ranks_per_node, n)
    nodes = [list(range(start, min(start + k, n))) for start in range(0, n, k)]
    m = len(nodes)
    if variant == "leader":
        every = tuple(range(m))  # m chunks, so the leaders' ring can split the buffer
        local_reduce = merge_parallel(
            *[_relabel(tree_reduce_steps(len(nd), 0, every), nd) for nd in nodes]
        )
        leaders = [nd[0] for nd in nodes]
        blocks = [(c,) for c in range(m)]
        across = ring_reduce_scatter_steps(leaders, blocks) + ring_all_gather_steps(leaders, blocks)
        local_bcast = merge_parallel(
            *[_relabel(tree_broadcast_steps(len(nd), 0, every), nd) for nd in nodes]
        )
        steps = (*local_reduce, *across, *local_bcast)
        return CollectiveSchedule("all_reduce", "hierarchical", n, m, tuple(s for s in steps if s))
    if n % k:
        raise ValueError(
            f"variant='shard' needs equal nodes: world size {n} is not a multiple of ranks_per_node {k}"
        )
    # chunk index = g * m + j: shard g (owned by local rank g) split into m pieces for the inter-node ring
    shard = [tuple(range(g * m, (g + 1) * m)) for g in range(k)]
    inside_rs = merge_parallel(*[ring_reduce_scatter_steps(nd, shard) for nd in nodes])
    columns = [[nodes[j][g] for j in range(m)] for g in range(k)]
    across = merge_parallel(
        *[
            ring_reduce_scatter_steps(col, [(g * m + j,) for j in range(m)])
            + ring_all_gather_steps(col, [(g * m + j,) for j in range(m)])
            for g, col in enumerate(columns)
        ]
    )
    inside_ag = merge_parallel(*[ring_all_gather_steps(nd, shard) for nd in nodes])
    steps = (*inside_rs, *across, *inside_ag)
    return CollectiveSchedule(
        "all_reduce", "hierarchical_shard", n, k * m, tuple(s for s in steps if s)
    )


def hierarchical_all_reduce(
    tensor, op="sum", group: Group = None, *, ranks_per_node: int, variant: str = "leader"
) -> None:
    """All-reduce in place in two levels: inside nodes of ``ranks_per_node`` ranks, then across.

    See the module docstring for the ``"leader"`` and ``"shard"`` variants.
    """
    from . import api

    api.all_reduce(
        hierarchical_all_reduce_schedule, "hierarchical_all_reduce", tensor, op, group,
        schedule_args=(ranks_per_node, variant),
    )  # fmt: skip
