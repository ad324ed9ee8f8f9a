"""Choose nodes for a gang of TP groups: first-fit, best-fit, and how fragmented the cluster is.

The scheduler hands out GPUs in **TP groups**: a job of ``tp * cp * dp * pp``
GPUs is ``cp * dp * pp`` groups of ``tp`` GPUs, and each group must sit in one
node (``tp <= gpus_per_node``) or in whole nodes of one NVLink domain
(``tp > gpus_per_node``, e.g. tp=8 on a GB200 NVL72 of 4-GPU trays). All of
a job's groups are allocated at once or none (gang scheduling).

* **first-fit** walks the nodes in index order and fills each one it can use;
* **best-fit** puts a job that fits in one node on the fullest node that can
  take all of it; a bigger job fills the nodes with the *fewest* free GPUs first.
  Partly used nodes fill up and whole nodes stay free for big jobs.

Fragmentation (:func:`stranded_fraction`): free GPUs that cannot host even the
smallest waiting TP group, as a fraction of all free GPUs.
"""

from __future__ import annotations

import numpy as np

POLICIES = ("first-fit", "best-fit")

Slot = tuple[int, ...]  # the node(s) one TP group occupies


def group_capacity(free: np.ndarray, tp: int, gpus_per_node: int, domain_nodes: int) -> int:
    """How many TP groups of size ``tp`` fit in the free GPUs ``free[node]`` right now."""
    if tp <= gpus_per_node:
        return int((free // tp).sum())
    per_group = tp // gpus_per_node
    return int((_whole_nodes_per_domain(free, gpus_per_node, domain_nodes) // per_group).sum())


def _whole_nodes_per_domain(free: np.ndarray, gpus_per_node: int, domain_nodes: int) -> np.ndarray:
    domain = np.arange(len(free)) // domain_nodes
    return np.bincount(domain, weights=free == gpus_per_node).astype(int)


def allocate(
    free: np.ndarray, n_groups: int, tp: int, gpus_per_node: int, domain_nodes: int, policy: str
) -> list[Slot] | None:
    """Pick ``n_groups`` slots for TP groups of ``tp`` GPUs, or ``None`` if they do not all fit.

    ``free`` (free GPUs per node) is not changed; apply the result with :func:`take`.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; allowed: {POLICIES}")
    if group_capacity(free, tp, gpus_per_node, domain_nodes) < n_groups:
        return None
    if tp <= gpus_per_node:
        return _allocate_in_nodes(free, n_groups, tp, policy)
    return _allocate_in_domains(
        free, n_groups, tp // gpus_per_node, gpus_per_node, domain_nodes, policy
    )


def _allocate_in_nodes(free: np.ndarray, n_groups: int, tp: int, policy: str) -> list[Slot]:
    cap = free // tp
    nodes = np.flatnonzero(cap)
    if policy == "best-fit":
        whole_job = nodes[cap[nodes] >= n_groups]
        if len(whole_job):  # the fullest node that takes the whole job
            return [(int(whole_job[np.argmin(free[whole_job])]),)] * n_groups
        nodes = nodes[np.argsort(free[nodes], kind="stable")]
    slots: list[Slot] = []
    for node in nodes.tolist():
        take_here = min(int(cap[node]), n_groups - len(slots))
        slots += [(node,)] * take_here
        if len(slots) == n_groups:
            break
    return slots


def _allocate_in_domains(free, n_groups, nodes_per_group, gpus_per_node, domain_nodes, policy):
    whole = _whole_nodes_per_domain(free, gpus_per_node, domain_nodes)
    cap = whole // nodes_per_group
    domains = np.flatnonzero(cap)
    if policy == "best-fit":
        domains = domains[np.argsort(whole[domains], kind="stable")]
    slots: list[Slot] = []
    for d in domains.tolist():
        members = np.arange(d * domain_nodes, min((d + 1) * domain_nodes, len(free)))
        idle = members[free[members] == gpus_per_node].tolist()
        for k in range(min(int(cap[d]), n_groups - len(slots))):
            slots.append(tuple(idle[k * nodes_per_group : (k + 1) * nodes_per_group]))
        if len(slots) == n_groups:
            break
    return slots


def gpus_per_slot_node(tp: int, gpus_per_node: int) -> int:
    """GPUs a slot uses on each of its nodes."""
    return min(tp, gpus_per_node)


def take(free: np.ndarray, slots: list[Slot], tp: int, gpus_per_node: int, sign: int = -1) -> None:
    """Subtract (``sign=-1``) or give back (``sign=+1``) the slots' GPUs in ``free``, in place."""
    per_node = gpus_per_slot_node(tp, gpus_per_node)
    for slot in slots:
        for node in slot:
            free[node] += sign * per_node


def stranded_fraction(free: np.ndarray, smallest_group: int | None, gpus_per_node: int) -> float:
    """Free GPUs that cannot host the smallest waiting TP group, over all free GPUs.

    ``smallest_group`` ``None`` (nobody waits): 0. A group of ``tp > gpus_per_node``
    needs whole free nodes, so every GPU of a partly used node is stranded.
    """
    total = int(free.sum())
    if total == 0 or smallest_group is None:
        return 0.0
    if smallest_group <= gpus_per_node:
        stranded = int((free % smallest_group).sum())
    else:
        stranded = int(free[free < gpus_per_node].sum())
    return stranded / total


def partial_node_fraction(free: np.ndarray, gpus_per_node: int) -> float:
    """Free GPUs on nodes that are partly in use, over all free GPUs (0 when nothing is free).

    Independent of the queue: the share of free capacity that a whole-node job cannot use.
    """
    total = int(free.sum())
    if total == 0:
        return 0.0
    return int(free[free < gpus_per_node].sum()) / total
