"""The cluster a placer sees: nodes, GPUs, NVLink domains, racks, and the link between two GPUs.

The hardware itself is :class:`distlab.sim.topology.ClusterSpec` (shared with
the simulator, presets ``dgx-a100``, ``dgx-h100``, ``pcie-8gpu``,
``gb200-nvl72``, ``ethernet``). This module adds what placement needs on top:

* :func:`resolve_cluster`: a spec from a preset name, a dict, a JSON/YAML file;
* :func:`nvlink_group_limit`: the largest group that still talks over NVLink
  (an NVSwitch domain; a PCIe box's node);
* :func:`rack_of`, :func:`node_of`;
* :func:`edge_costs`: for many messages at once (numpy arrays of source and
  destination GPUs), the latency and the bandwidth each one gets. It follows
  :meth:`ClusterSpec.route` and charges contention the way
  :mod:`distlab.sim.replay` does: messages sent at the same time that occupy
  the same port (a NIC, a PCIe switch crossing, a shared bus) divide its
  bandwidth. Vectorised so a 100,000-GPU job is scored in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distlab.core.checks import positive_int
from distlab.sim.topology import (
    ROUTE_KINDS,
    ClusterSpec,
    cluster_from_dict,
    load_cluster,
    nic_index,
    preset,
    route_kinds,
)


def resolve_cluster(
    cluster: ClusterSpec | str | dict | Path, *, nodes: int | None = None
) -> ClusterSpec:
    """A :class:`ClusterSpec` from a spec, a preset name, a dict or a ``.json``/``.yaml`` path.

    ``nodes`` overrides the node count (``resolve_cluster("dgx-h100", nodes=128)``).
    An unknown preset raises ``ValueError`` listing the known ones.
    """
    if isinstance(cluster, ClusterSpec):
        spec = cluster
    elif isinstance(cluster, dict):
        spec = cluster_from_dict(cluster)
    elif isinstance(cluster, Path) or (
        isinstance(cluster, str) and Path(cluster).suffix in (".json", ".yaml", ".yml")
    ):
        spec = load_cluster(cluster)
    elif isinstance(cluster, str):
        spec = preset(cluster)
    else:
        raise TypeError(
            f"cluster must be a ClusterSpec, a preset name, a dict or a path, got {type(cluster).__name__}"
        )
    if nodes is not None:
        nodes = positive_int("nodes", nodes)
        spec = spec.with_nodes(nodes)
    return spec


def nvlink_group_limit(cluster: ClusterSpec) -> int:
    """The most GPUs one tensor-parallel group may span without leaving the fast fabric.

    With an NVSwitch (``intra_kind == "switch"``) that is the NVLink domain
    (8 on a DGX, 72 on a GB200 NVL72); without one it is the node.
    """
    if cluster.intra_kind == "switch":
        return cluster.nvlink_domain_gpus
    return cluster.gpus_per_node


def node_of(cluster: ClusterSpec, gpus: np.ndarray) -> np.ndarray:
    """Node index of each GPU (GPUs are numbered node by node)."""
    return np.asarray(gpus) // cluster.gpus_per_node


def rack_of(cluster: ClusterSpec, gpus: np.ndarray) -> np.ndarray:
    """Rack index of each GPU (``nodes_per_rack`` consecutive nodes share a rack)."""
    return node_of(cluster, gpus) // cluster.nodes_per_rack


@dataclass(frozen=True)
class EdgeCosts:
    """Per message: route kind (index into :data:`ROUTE_KINDS`), latency (s), bandwidth (bytes/s).

    ``bandwidth`` is what the message gets after sharing its busiest port with
    the other messages of the same batch.
    """

    kind: np.ndarray
    alpha: np.ndarray
    bandwidth: np.ndarray

    def kind_names(self) -> list[str]:
        return [ROUTE_KINDS[k] for k in np.unique(self.kind)]


def edge_costs(cluster: ClusterSpec, src: np.ndarray, dst: np.ndarray) -> EdgeCosts:
    """Route kind, latency and contended bandwidth of messages ``src[i] -> dst[i]`` sent together.

    The kinds and ports are those of :meth:`ClusterSpec.route` (tested equal
    message by message); a port carrying ``k`` of the messages gives each
    ``bandwidth / k`` (fair sharing, as in the replay).
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    g = cluster.gpus_per_node
    if src.size and (
        min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= cluster.world_size
    ):
        raise ValueError(
            f"GPU ids must be in 0..{cluster.world_size - 1} for cluster {cluster.name!r}"
        )
    node_s, node_d = src // g, dst // g
    kind = route_kinds(cluster, src, dst)  # the one "which link" rule, shared with route()

    alpha = np.zeros(src.shape)
    bandwidth = np.full(src.shape, np.inf)
    # each entry: (mask of messages, their link, port ids whose load divides the bandwidth)
    nics = cluster.nics_per_node
    nic_s = node_s * nics + nic_index(cluster, src)
    nic_d = node_d * nics + nic_index(cluster, dst)
    for name, link, ports in (
        ("nvlink", cluster.intra, [src, dst + cluster.world_size]),
        ("pcie", cluster.intra, [src, dst + cluster.world_size]),
        ("bus", cluster.intra, [node_s]),
        ("network", cluster.inter, [nic_s, nic_d + cluster.nodes * nics]),
    ):
        _charge(
            kind == ROUTE_KINDS.index(name), link.alpha, link.bandwidth, ports, alpha, bandwidth
        )
    far = kind == ROUTE_KINDS.index("pcie-far")
    if far.any():
        per_switch = cluster.gpus_per_pcie_switch
        n_sw = -(-g // per_switch)
        crossing = (node_s * n_sw + (src % g) // per_switch) * n_sw + (dst % g) // per_switch
        _charge(
            far,
            cluster.intra.alpha,
            cluster.intra.bandwidth,
            [src, dst + cluster.world_size],
            alpha,
            bandwidth,
        )
        _charge(
            far, cluster.far_intra.alpha, cluster.far_intra.bandwidth, [crossing], alpha, bandwidth
        )
    return EdgeCosts(kind=kind, alpha=alpha, bandwidth=bandwidth)


def _charge(mask, link_alpha, link_bw, ports, alpha, bandwidth) -> None:
    """Give the messages in ``mask`` the link's latency and ``bw / load`` of their busiest port."""
    if not mask.any():
        return
    share = np.full(int(mask.sum()), float(link_bw))
    for port in ports:
        ids = np.asarray(port)[mask]
        _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        share = np.minimum(share, link_bw / counts[inverse])
    alpha[mask] = link_alpha  # a later charge (the slow PCIe crossing) sets the route's latency
    bandwidth[mask] = np.minimum(bandwidth[mask], share)
