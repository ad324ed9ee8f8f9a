"""Clusters as data: GPUs per node, the links between them, and presets.

A cluster here is hierarchical, as real training clusters are:

* inside a node, GPUs talk over an intra-node fabric: ``"switch"`` (NVSwitch:
  every pair at full NVLink bandwidth at once), or ``"pcie"`` (no switch:
  GPUs behind the same PCIe switch are close, across CPU sockets they are far);
* an *NVLink domain* may span several nodes (GB200 NVL72: 18 trays of 4 GPUs
  share one NVLink switch fabric);
* between nodes, each node has ``nics_per_node`` network cards (InfiniBand or
  Ethernet); a DGX gives every GPU its own NIC;
* nodes sit in racks.

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One kind of link: latency ``alpha`` (s) and bandwidth (bytes/s, one direction)."""

    name: str
    alpha: float
    bandwidth: float

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"link {self.name!r}: alpha must be >= 0 seconds, got {self.alpha}")
        if self.bandwidth <= 0:
            raise ValueError(f"link {self.name!r}: bandwidth must be > 0 bytes/s, got {self.bandwidth}")

    @property
    def beta(self) -> float:
        """Seconds per byte (1 / bandwidth)."""
        return 1.0 / self.bandwidth

    def time(self, n_bytes: float) -> float:
        """alpha + n_bytes / bandwidth."""
        return self.alpha + n_bytes / self.bandwidth


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous GPU cluster.

    ``intra``: GPU-to-GPU link inside a node (inside an NVLink domain).
    ``intra_kind``: ``"switch"`` (NVSwitch, full bisection) or ``"pcie"``.
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
        for field_name in ("nodes", "gpus_per_node", "nics_per_node", "nvlink_domain_nodes", "nodes_per_rack"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"cluster {self.name!r}: {field_name} must be an integer >= 1, got {value!r}")
        if self.intra_kind not in ("switch", "pcie"):
            raise ValueError(f"cluster {self.name!r}: intra_kind must be 'switch' or 'pcie', got {self.intra_kind!r}")
        if self.intra_kind == "pcie" and (self.far_intra is None or not self.gpus_per_pcie_switch):
            raise ValueError(f"cluster {self.name!r}: a 'pcie' node needs far_intra and gpus_per_pcie_switch")

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
    """Read a cluster spec from a .json or .yaml/.yml file."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    return cluster_from_dict(data)


NVLINK3 = Link("NVLink3 (A100, via NVSwitch)", alpha=2e-6, bandwidth=300 * GB)
NVLINK4 = Link("NVLink4 (H100, via NVSwitch)", alpha=2e-6, bandwidth=450 * GB)
NVLINK5 = Link("NVLink5 (GB200 NVL72)", alpha=2e-6, bandwidth=900 * GB)
PCIE4_NEAR = Link("PCIe 4.0 x16, same PCIe switch", alpha=5e-6, bandwidth=25 * GB)
PCIE4_FAR = Link("PCIe 4.0 across CPU sockets (UPI)", alpha=8e-6, bandwidth=12 * GB)
IB_HDR = Link("InfiniBand HDR 200 Gb/s", alpha=5e-6, bandwidth=25 * GB)
IB_NDR = Link("InfiniBand NDR 400 Gb/s", alpha=5e-6, bandwidth=50 * GB)
ETH_100G = Link("100 Gb Ethernet (TCP)", alpha=30e-6, bandwidth=12.5 * GB)

PRESETS: dict[str, ClusterSpec] = {
    "dgx-a100": ClusterSpec(
        "dgx-a100", nodes=4, gpus_per_node=8, intra=NVLINK3, inter=IB_HDR, nics_per_node=8,
        gpu_memory_bytes=80e9, gpu_peak_flops=312e12,
    ),
    "dgx-h100": ClusterSpec(
        "dgx-h100", nodes=4, gpus_per_node=8, intra=NVLINK4, inter=IB_NDR, nics_per_node=8,
        gpu_memory_bytes=80e9, gpu_peak_flops=989e12,
    ),
    "pcie-8gpu": ClusterSpec(
        "pcie-8gpu", nodes=1, gpus_per_node=8, intra=PCIE4_NEAR, inter=ETH_100G, nics_per_node=1,
        intra_kind="pcie", far_intra=PCIE4_FAR, gpus_per_pcie_switch=4,
        gpu_memory_bytes=48e9, gpu_peak_flops=150e12,
    ),
    "gb200-nvl72": ClusterSpec(
        "gb200-nvl72", nodes=18, gpus_per_node=4, intra=NVLINK5, inter=IB_NDR, nics_per_node=4,
        nvlink_domain_nodes=18, nodes_per_rack=18, gpu_memory_bytes=186e9, gpu_peak_flops=2500e12,
    ),
    "ethernet": ClusterSpec(
        "ethernet", nodes=8, gpus_per_node=4, intra=PCIE4_NEAR, inter=ETH_100G, nics_per_node=1,
        intra_kind="pcie", far_intra=PCIE4_FAR, gpus_per_pcie_switch=2,
        gpu_memory_bytes=24e9, gpu_peak_flops=150e12,
    ),
}


def preset(name: str, *, nodes: int | None = None) -> ClusterSpec:
    """A preset cluster by name (see ``PRESETS``), optionally with another node count."""
    if name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; known presets: {sorted(PRESETS)}")
    spec = PRESETS[name]
    return spec if nodes is None else spec.with_nodes(nodes)
