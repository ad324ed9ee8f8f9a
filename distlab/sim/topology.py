"""Clusters as data: GPUs per node, the links between them, and presets.

A cluster here is hierarchical, as real training clusters are:

* inside a node, GPUs talk over an intra-node fabric: ``"switch"`` (NVSwitch:
  every pair at full NVLink bandwidth at once), or ``"pcie"`` (no switch:
  GPUs behind the same PCIe switch are close, across CPU sockets they are far);
* an *NVLink domain* may span several nodes (GB200 NVL72: 18 trays of 4 GPUs
  share one NVLink switch fabric);
* between nodes, each node has ``nics_per_node`` network cards (InfiniBand or
  Ethernet); a DGX gives every GPU its own NIC;
* nodes sit in racks;
* ``"bus"``: every GPU of a node shares one medium (a hub, or processes on one
  laptop talking over loopback TCP): all messages inside the node share its
  bandwidth.

:meth:`ClusterSpec.route` says which link a message from GPU ``a`` to GPU ``b``
uses and which *ports* it occupies; messages that occupy the same port at the
same time share its bandwidth (the replay in :mod:`distlab.sim.replay`).

Bandwidths are **bytes per second in one direction**; latencies are seconds.
The alpha-beta model (Hockney) says a message of ``n`` bytes over a link costs
``alpha + n / bandwidth``. Pure Python, no torch.

Preset figures are vendor data-sheet numbers (per GPU, one direction):
A100 NVLink3 300 GB/s (600 GB/s bidirectional), H100 NVLink4 450 GB/s
(900 GB/s bidirectional), GB200 NVLink5 900 GB/s (1.8 TB/s bidirectional),
HDR InfiniBand 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s, PCIe 4.0 x16
about 32 GB/s raw (about 25 GB/s achieved), 100 Gb Ethernet 12.5 GB/s.
Latencies are typical orders of magnitude (a few microseconds per hop for
NVLink and InfiniBand with NCCL, tens of microseconds for TCP over Ethernet);
they are model parameters, not measurements, and can be fitted
(:mod:`distlab.sim.fit`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from distlab.core.checks import int_in, positive_int

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One kind of link: latency ``alpha`` (s) and bandwidth (bytes/s, one direction)."""

    name: str
    alpha: float
    bandwidth: float

    def __post_init__(self) -> None:
        for field_name in ("alpha", "bandwidth"):
            value = getattr(self, field_name)
            if isinstance(value, str):  # YAML 1.1 reads "2.0e10" (no exponent sign) as text
                try:
                    object.__setattr__(self, field_name, float(value))
                except ValueError:
                    raise ValueError(
                        f"link {self.name!r}: {field_name} must be a number, got {value!r}"
                    ) from None
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"link {self.name!r}: {field_name} must be a number, got {value!r}")
        if self.alpha < 0:
            raise ValueError(f"link {self.name!r}: alpha must be >= 0 seconds, got {self.alpha}")
        if self.bandwidth <= 0:
            raise ValueError(
                f"link {self.name!r}: bandwidth must be > 0 bytes/s, got {self.bandwidth}"
            )

    @property
    def beta(self) -> float:
        """Seconds per byte (1 / bandwidth)."""
        return 1.0 / self.bandwidth

    def time(self, n_bytes: float) -> float:
        """alpha + n_bytes / bandwidth."""
        return self.alpha + n_bytes / self.bandwidth


#: Kinds of intra-node fabric a :class:`ClusterSpec` knows.
INTRA_KINDS = ("switch", "pcie", "bus")


@dataclass(frozen=True)
class Route:
    """How one message from GPU ``src`` to GPU ``dst`` travels.

    ``kind``: ``"local"`` (same GPU, free), ``"nvlink"`` (through an NVSwitch /
    NVLink domain), ``"pcie"`` (peer-to-peer under one PCIe switch),
    ``"pcie-far"`` (between PCIe switches, across the CPU sockets), ``"bus"``
    (a medium shared by the whole node) or ``"network"`` (NIC to NIC).
    ``alpha``: the latency the message pays (s).
    ``ports``: the shared resources it occupies, each ``(name, bytes/s)``.
    Messages that occupy one port at the same time share its bandwidth.
    """

    kind: str
    alpha: float
    ports: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous GPU cluster.

    ``intra``: GPU-to-GPU link inside a node (inside an NVLink domain).
    ``intra_kind``: ``"switch"`` (NVSwitch, full bisection), ``"pcie"`` or
    ``"bus"`` (one medium shared by every GPU of the node).
    ``far_intra``: for ``"pcie"`` boxes, the slower path between GPUs on
    different PCIe switches / CPU sockets (``gpus_per_pcie_switch`` apart).
    ``inter``: one NIC's link; ``nics_per_node`` of them per node.
    ``nvlink_domain_nodes``: how many nodes share one NVLink domain (1 = the node).
    """

    name: str
    nodes: int
    gpus_per_node: int
    intra: Link
    inter: Link
    nics_per_node: int
    intra_kind: str = "switch"
    far_intra: Link | None = None
    gpus_per_pcie_switch: int | None = None
    nvlink_domain_nodes: int = 1
    nodes_per_rack: int = 32
    gpu_memory_bytes: float = 80e9
    gpu_peak_flops: float = 312e12

    def __post_init__(self) -> None:
        for field_name in (
            "nodes",
            "gpus_per_node",
            "nics_per_node",
            "nvlink_domain_nodes",
            "nodes_per_rack",
        ):
            value = getattr(self, field_name)
            positive_int(f"cluster {self.name!r}: {field_name}", value)
        if self.intra_kind not in INTRA_KINDS:
            raise ValueError(
                f"cluster {self.name!r}: intra_kind must be one of {INTRA_KINDS}, "
                f"got {self.intra_kind!r}"
            )
        if self.intra_kind == "pcie" and (self.far_intra is None or not self.gpus_per_pcie_switch):
            raise ValueError(
                f"cluster {self.name!r}: a 'pcie' node needs far_intra and gpus_per_pcie_switch"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        return self.gpus_per_node * self.nvlink_domain_nodes

    def with_nodes(self, nodes: int) -> ClusterSpec:
        """The same hardware with a different number of nodes."""
        return replace(self, nodes=nodes)

    def to_dict(self) -> dict:
        return asdict(self)

    # -- where a GPU sits -------------------------------------------------
    # GPUs are numbered 0 .. world_size - 1, node by node.

    def _check_gpu(self, gpu: int) -> None:
        int_in(
            f"cluster {self.name!r} ({self.nodes} nodes x {self.gpus_per_node}): GPU",
            gpu,
            0,
            self.world_size - 1,
        )

    def node_of(self, gpu: int) -> int:
        """The node that holds GPU ``gpu``."""
        self._check_gpu(gpu)
        return gpu // self.gpus_per_node

    def nvlink_domain_of(self, gpu: int) -> int:
        """The NVLink domain (group of ``nvlink_domain_nodes`` nodes) of ``gpu``."""
        return self.node_of(gpu) // self.nvlink_domain_nodes

    def pcie_switch_of(self, gpu: int) -> int:
        """Index of the PCIe switch ``gpu`` sits under, inside its node (pcie boxes)."""
        self._check_gpu(gpu)
        return (gpu % self.gpus_per_node) // (self.gpus_per_pcie_switch or self.gpus_per_node)

    def nic_of(self, gpu: int) -> int:
        """The NIC ``gpu`` sends through: NICs are shared by consecutive GPUs.

        With one NIC per GPU (DGX, rail-optimised) GPU ``i`` of a node uses NIC
        ``i``; with fewer NICs, ``gpus_per_node / nics_per_node`` neighbours share one.
        """
        self._check_gpu(gpu)
        return int(nic_index(self, gpu))

    # -- which link a message uses -----------------------------------------

    def link_class(self, src: int, dst: int) -> str:
        """The kind of path between two GPUs (see :class:`Route`)."""
        return self.route(src, dst).kind

    def route(self, src: int, dst: int) -> Route:
        """Which link a message from GPU ``src`` to GPU ``dst`` uses, and the ports it occupies.

        * same GPU: ``local``, no cost;
        * same NVLink domain with an NVSwitch: each GPU has its own full-bandwidth
          port per direction, so the message occupies ``src``'s out-port and
          ``dst``'s in-port only;
        * ``pcie``, same PCIe switch: the two GPUs' x16 links;
        * ``pcie``, different switches: the two x16 links plus the slower
          ``far_intra`` path between the two switches (shared by every message
          crossing it in that direction);
        * ``bus``: one medium per node, shared by every message inside it;
        * different nodes (domains): ``src``'s NIC out and ``dst``'s NIC in
          (see :meth:`nic_of`); the GPU-to-NIC hop is assumed not to be the bottleneck.
        """
        self._check_gpu(src)
        self._check_gpu(dst)
        kind = ROUTE_KINDS[int(route_kinds(self, src, dst))]
        node_s, node_d = src // self.gpus_per_node, dst // self.gpus_per_node
        if kind == "local":
            return Route("local", 0.0, ())
        if kind == "nvlink":
            bw = self.intra.bandwidth
            return Route("nvlink", self.intra.alpha, ((f"gpu{src} out", bw), (f"gpu{dst} in", bw)))
        if kind == "network":
            bw = self.inter.bandwidth
            out = f"node{node_s} nic{self.nic_of(src)} out"
            into = f"node{node_d} nic{self.nic_of(dst)} in"
            return Route("network", self.inter.alpha, ((out, bw), (into, bw)))
        if kind == "bus":
            return Route("bus", self.intra.alpha, ((f"node{node_s} bus", self.intra.bandwidth),))
        bw = self.intra.bandwidth
        ends = ((f"gpu{src} pcie out", bw), (f"gpu{dst} pcie in", bw))
        if kind == "pcie":
            return Route("pcie", self.intra.alpha, ends)
        sw_s, sw_d = self.pcie_switch_of(src), self.pcie_switch_of(dst)
        far = self.far_intra
        assert far is not None  # checked in __post_init__
        cross = (f"node{node_s} pcie-switch{sw_s}->switch{sw_d}", far.bandwidth)
        return Route("pcie-far", far.alpha, (ends[0], cross, ends[1]))


#: The paths a message can take, as :meth:`ClusterSpec.route` names them;
#: :func:`route_kinds` returns indices into this tuple.
ROUTE_KINDS = ("local", "nvlink", "pcie", "pcie-far", "bus", "network")


def route_kinds(cluster: ClusterSpec, src, dst):
    """Which path each message ``src[i] -> dst[i]`` takes, as indices into :data:`ROUTE_KINDS`.

    The one rule for "which link", used by :meth:`ClusterSpec.route` (one message) and by
    :func:`distlab.placement.cluster.edge_costs` (a whole job's messages at once):

    * same GPU: ``local``;
    * NVSwitch clusters: ``nvlink`` inside an NVLink domain, else ``network``;
    * a shared bus: ``bus`` inside a node, else ``network``;
    * PCIe boxes: ``pcie`` under one PCIe switch, ``pcie-far`` across two switches of a
      node, else ``network``.

    ``src`` and ``dst`` are GPU ids or numpy arrays of them; returns an integer array.
    (numpy is imported here, not at the top, so that ``distlab.calc`` stays numpy-free.)
    """
    import numpy as np

    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    g = cluster.gpus_per_node
    node_s, node_d = src // g, dst // g
    same_node = node_s == node_d
    kind = np.full(src.shape, ROUTE_KINDS.index("network"))
    if cluster.intra_kind == "switch":
        domain = cluster.nvlink_domain_gpus
        kind[src // domain == dst // domain] = ROUTE_KINDS.index("nvlink")
    elif cluster.intra_kind == "bus":
        kind[same_node] = ROUTE_KINDS.index("bus")
    else:
        per_switch = cluster.gpus_per_pcie_switch
        near = (src % g) // per_switch == (dst % g) // per_switch
        kind[same_node & near] = ROUTE_KINDS.index("pcie")
        kind[same_node & ~near] = ROUTE_KINDS.index("pcie-far")
    kind[src == dst] = ROUTE_KINDS.index("local")
    return kind


def nic_index(cluster: ClusterSpec, gpus):
    """The NIC of the node each GPU sends through (see :meth:`ClusterSpec.nic_of`)."""
    import numpy as np

    local = np.asarray(gpus, dtype=np.int64) % cluster.gpus_per_node
    nics = cluster.nics_per_node
    return np.minimum(local * nics // cluster.gpus_per_node, nics - 1)


def group_link(cluster: ClusterSpec, groups: Sequence[Sequence[int]]) -> Link | None:
    """The link the slowest of ``groups`` communicates over; ``None`` for groups of one rank.

    ``groups`` are process groups of equal size, each listing its ranks in increasing order
    (as :func:`distlab.core.ranks.rank_groups` returns them); rank ``r`` runs on GPU
    ``r``. The same paths as :meth:`ClusterSpec.route`, seen from a whole group:

    * every group inside one NVLink domain (node): the intra-node link; a shared bus is
      divided among the group's ``size`` ranks; on a PCIe box a group that spans two PCIe
      switches uses the slower ``far_intra`` path;
    * some group crossing domains: the network, each GPU getting its share of the node's
      NICs (:func:`network_link`).

    Domain, node and switch indices grow with the rank, so a group stays in one of them
    when its first and last ranks do: each group costs O(1).
    """
    size = len(groups[0]) if len(groups) else 1
    if size == 1:
        return None
    if _straddles(groups, cluster.nvlink_domain_gpus):
        return network_link(cluster)
    intra = cluster.intra
    if cluster.intra_kind == "bus":
        return Link(f"{intra.name} shared by {size}", intra.alpha, intra.bandwidth / size)
    per_switch = cluster.gpus_per_pcie_switch
    if cluster.intra_kind == "pcie" and per_switch and _straddles(groups, per_switch):
        return cluster.far_intra
    return intra


def _straddles(groups, unit: int) -> bool:
    """True when some group's first and last ranks lie in different blocks of ``unit`` ranks.

    Also takes a numpy ``(n_groups, size)`` array (:func:`distlab.core.ranks.group_array`)
    and then compares whole columns at once."""
    if hasattr(groups, "shape"):
        return bool((groups[:, 0] // unit != groups[:, -1] // unit).any())
    return any(g[0] // unit != g[-1] // unit for g in groups)


def network_link(cluster: ClusterSpec) -> Link:
    """The inter-node link as one GPU sees it: ``nics_per_node / gpus_per_node`` of a NIC
    when GPUs share NICs, the whole link otherwise."""
    inter = cluster.inter
    share = cluster.nics_per_node / cluster.gpus_per_node
    if share >= 1:
        return inter
    return Link(f"{inter.name} ({share:g} NIC per GPU)", inter.alpha, inter.bandwidth * share)


def _link(d: dict | Link) -> Link:
    return d if isinstance(d, Link) else Link(**d)


def cluster_from_dict(spec: dict) -> ClusterSpec:
    """Build a :class:`ClusterSpec` from a dict (e.g. parsed JSON/YAML).

    ``{"preset": "dgx-h100", "nodes": 4}`` starts from a preset and overrides fields.
    """
    spec = dict(spec)
    if "preset" in spec:
        base = preset(spec.pop("preset")).to_dict()
        base.update(spec)
        spec = base
    for key in ("intra", "inter", "far_intra"):
        if spec.get(key) is not None:
            spec[key] = _link(spec[key])
    try:
        return ClusterSpec(**spec)
    except TypeError as exc:
        raise ValueError(f"bad cluster spec: {exc}") from None


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster spec from a .json or .yaml/.yml file.

    A file that cannot be read raises ``ValueError`` naming it.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read cluster file {str(path)!r}: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)  # a malformed file raises json.JSONDecodeError, a ValueError
    return cluster_from_dict(data)


NVLINK3 = Link("NVLink3 (A100, via NVSwitch)", alpha=2e-6, bandwidth=300 * GB)
NVLINK4 = Link("NVLink4 (H100, via NVSwitch)", alpha=2e-6, bandwidth=450 * GB)
NVLINK5 = Link("NVLink5 (GB200 NVL72)", alpha=2e-6, bandwidth=900 * GB)
PCIE4_NEAR = Link("PCIe 4.0 x16, same PCIe switch", alpha=5e-6, bandwidth=25 * GB)
PCIE4_FAR = Link("PCIe 4.0 across CPU sockets (UPI)", alpha=8e-6, bandwidth=12 * GB)
IB_HDR = Link("InfiniBand HDR 200 Gb/s", alpha=5e-6, bandwidth=25 * GB)
IB_NDR = Link("InfiniBand NDR 400 Gb/s", alpha=5e-6, bandwidth=50 * GB)
ETH_100G = Link("100 Gb Ethernet (TCP)", alpha=30e-6, bandwidth=12.5 * GB)

_LATENCY_GUESS = (
    "assumption: an order of magnitude for one NCCL message end to end (software included), "
    "not a measurement; fit it to your runs with distlab.sim.fit"
)
#: Where each preset link's two figures come from: ``"source: ..."`` (a data sheet, see
#: :mod:`distlab.sim.hardware`) or ``"assumption: ..."`` (a model parameter nobody published).
LINK_SOURCES: dict[str, dict[str, str]] = {
    NVLINK3.name: {
        "alpha": _LATENCY_GUESS,
        "bandwidth": "source: hardware.NVLINK3 (A100 whitepaper)",
    },
    NVLINK4.name: {
        "alpha": _LATENCY_GUESS,
        "bandwidth": "source: hardware.NVLINK4 (H100 whitepaper)",
    },
    NVLINK5.name: {
        "alpha": _LATENCY_GUESS,
        "bandwidth": "source: hardware.NVLINK5 (NVLink product page)",
    },
    PCIE4_NEAR.name: {
        "alpha": _LATENCY_GUESS,
        "bandwidth": "assumption: achieved peer-to-peer rate, about 80% of hardware.PCIE4's"
        " 31.5 GB/s raw x16",
    },
    PCIE4_FAR.name: {
        "alpha": _LATENCY_GUESS,
        "bandwidth": "assumption: about half the same-switch rate across the CPU sockets",
    },
    IB_HDR.name: {"alpha": _LATENCY_GUESS, "bandwidth": "source: hardware.IB_HDR (IBTA roadmap)"},
    IB_NDR.name: {"alpha": _LATENCY_GUESS, "bandwidth": "source: hardware.IB_NDR (IBTA roadmap)"},
    ETH_100G.name: {
        "alpha": _LATENCY_GUESS,
        "bandwidth": "source: hardware.ETHERNET_100G (IEEE 802.3)",
    },
}

PRESETS: dict[str, ClusterSpec] = {
    "dgx-a100": ClusterSpec(
        "dgx-a100",
        nodes=4,
        gpus_per_node=8,
        intra=NVLINK3,
        inter=IB_HDR,
        nics_per_node=8,
        gpu_memory_bytes=80e9,
        gpu_peak_flops=312e12,
    ),
    "dgx-h100": ClusterSpec(
        "dgx-h100",
        nodes=4,
        gpus_per_node=8,
        intra=NVLINK4,
        inter=IB_NDR,
        nics_per_node=8,
        gpu_memory_bytes=80e9,
        gpu_peak_flops=989e12,
    ),
    "pcie-8gpu": ClusterSpec(
        "pcie-8gpu",
        nodes=1,
        gpus_per_node=8,
        intra=PCIE4_NEAR,
        inter=ETH_100G,
        nics_per_node=1,
        intra_kind="pcie",
        far_intra=PCIE4_FAR,
        gpus_per_pcie_switch=4,
        gpu_memory_bytes=48e9,
        gpu_peak_flops=150e12,
    ),
    "gb200-nvl72": ClusterSpec(
        "gb200-nvl72",
        nodes=18,
        gpus_per_node=4,
        intra=NVLINK5,
        inter=IB_NDR,
        nics_per_node=4,
        nvlink_domain_nodes=18,
        nodes_per_rack=18,
        gpu_memory_bytes=186e9,
        gpu_peak_flops=2500e12,
    ),
    "ethernet": ClusterSpec(
        "ethernet",
        nodes=8,
        gpus_per_node=4,
        intra=PCIE4_NEAR,
        inter=ETH_100G,
        nics_per_node=1,
        intra_kind="pcie",
        far_intra=PCIE4_FAR,
        gpus_per_pcie_switch=2,
        gpu_memory_bytes=24e9,
        gpu_peak_flops=150e12,
    ),
}


def uniform_cluster(n_gpus: int, link: Link, *, name: str = "uniform") -> ClusterSpec:
    """``n_gpus`` GPUs behind one ideal switch, every port ``link``: the uniform
    network the closed-form alpha-beta costs assume (each GPU can send and
    receive one message at full bandwidth at the same time)."""
    return ClusterSpec(name, nodes=1, gpus_per_node=n_gpus, intra=link, inter=link, nics_per_node=1)


def shared_bus(n_gpus: int, link: Link, *, name: str = "shared-bus") -> ClusterSpec:
    """``n_gpus`` on one shared medium of bandwidth ``link.bandwidth``: every
    concurrent message divides it (processes on one laptop over loopback TCP)."""
    return ClusterSpec(
        name,
        nodes=1,
        gpus_per_node=n_gpus,
        intra=link,
        inter=link,
        nics_per_node=1,
        intra_kind="bus",
    )


def preset(name: str, *, nodes: int | None = None) -> ClusterSpec:
    """A preset cluster by name (see ``PRESETS``), optionally with another node count."""
    if name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; known presets: {sorted(PRESETS)}")
    spec = PRESETS[name]
    return spec if nodes is None else spec.with_nodes(nodes)
