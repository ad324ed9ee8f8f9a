"""The data-sheet figures behind the cluster presets, in one convention, with their sources.

Vendors quote interconnects in different conventions, and mixing them is the
most common error in back-of-the-envelope cost estimates:

* NVIDIA quotes NVLink per GPU with **both directions added** and summed over
  all of the GPU's links ("900 GB/s" for H100);
* network cards are quoted in **gigabits** per second, **per direction**
  ("400 Gb/s" NDR InfiniBand);
* PCIe is specified in **gigatransfers** per second per lane, before line
  encoding ("16 GT/s" for PCIe 4.0).

Here every figure is converted to **bytes per second in one direction**
(1 GB = 1e9 bytes), the convention of :class:`~distlab.sim.topology.Link`
and of nccl-tests' busbw; ``tests/test_sim_hardware.py`` checks the presets
against these numbers. Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.core.checks import int_in

GB = 1e9


@dataclass(frozen=True)
class NVLinkGeneration:
    """NVLink as one GPU of a generation has it: ``links`` links of
    ``link_bandwidth`` bytes/s each, per direction."""

    name: str
    gpu: str
    links: int
    link_bandwidth: float
    source: str

    @property
    def bandwidth(self) -> float:
        """Bytes/s per GPU, one direction: ``links * link_bandwidth``."""
        return self.links * self.link_bandwidth

    @property
    def bidirectional(self) -> float:
        """Bytes/s per GPU with both directions added: the data-sheet figure."""
        return 2 * self.bandwidth


@dataclass(frozen=True)
class PCIeGeneration:
    """A PCIe generation: ``transfers_per_s`` per lane, ``encoding`` payload bits per line bit."""

    name: str
    transfers_per_s: float
    encoding: float
    source: str

    def bandwidth(self, lanes: int = 16) -> float:
        """Raw bytes/s per direction over ``lanes`` lanes, before packet overheads:
        ``transfers_per_s * encoding * lanes / 8``."""
        lanes = int_in("lanes", lanes, 1, 16)
        return self.transfers_per_s * self.encoding * lanes / 8


@dataclass(frozen=True)
class NetworkPort:
    """One network port: ``bits_per_s`` data rate per direction."""

    name: str
    bits_per_s: float
    source: str

    @property
    def bandwidth(self) -> float:
        """Bytes/s per direction: ``bits_per_s / 8``."""
        return self.bits_per_s / 8


@dataclass(frozen=True)
class System:
    """What inside one server matters for communication."""

    name: str
    gpus: int
    nvlink: NVLinkGeneration
    nvswitches: int
    compute_nics: int
    nic: NetworkPort
    source: str


NVLINK3 = NVLinkGeneration(
    "NVLink 3",
    "A100",
    links=12,
    link_bandwidth=25 * GB,
    source="NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), Third-Generation NVLink: "
    "12 links, 25 GB/s per link per direction, 600 GB/s total",
)
NVLINK4 = NVLinkGeneration(
    "NVLink 4",
    "H100 SXM5",
    links=18,
    link_bandwidth=25 * GB,
    source="NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), Fourth-Generation NVLink: "
    "18 links, 900 GB/s total",
)
NVLINK5 = NVLinkGeneration(
    "NVLink 5",
    "B200 / GB200",
    links=18,
    link_bandwidth=50 * GB,
    source="NVIDIA NVLink and NVLink Switch product page (2024), fifth-generation NVLink: "
    "18 links of 100 GB/s, 1.8 TB/s total",
)
NVLINK = (NVLINK3, NVLINK4, NVLINK5)

PCIE4 = PCIeGeneration(
    "PCIe 4.0",
    transfers_per_s=16e9,
    encoding=128 / 130,
    source="PCI-SIG, PCI Express Base Specification 4.0 (2017): 16 GT/s per lane, 128b/130b",
)
PCIE5 = PCIeGeneration(
    "PCIe 5.0",
    transfers_per_s=32e9,
    encoding=128 / 130,
    source="PCI-SIG, PCI Express Base Specification 5.0 (2019): 32 GT/s per lane, 128b/130b",
)
PCIE = (PCIE4, PCIE5)

_IBTA = "InfiniBand Trade Association, InfiniBand roadmap: data rate of a 4x port"
IB_HDR = NetworkPort("InfiniBand HDR", 200e9, _IBTA)
IB_NDR = NetworkPort("InfiniBand NDR", 400e9, _IBTA)
IB_XDR = NetworkPort("InfiniBand XDR", 800e9, _IBTA)
ETHERNET_100G = NetworkPort("100 Gb Ethernet", 100e9, "IEEE 802.3 (100GBASE-R)")
NETWORK = (IB_HDR, IB_NDR, IB_XDR, ETHERNET_100G)

DGX_A100 = System(
    "DGX A100",
    gpus=8,
    nvlink=NVLINK3,
    nvswitches=6,
    compute_nics=8,
    nic=IB_HDR,
    source="NVIDIA DGX A100 System Architecture whitepaper (2020): six second-generation "
    "NVSwitches, eight single-port ConnectX-6 HDR adapters for the compute fabric",
)
DGX_H100 = System(
    "DGX H100",
    gpus=8,
    nvlink=NVLINK4,
    nvswitches=4,
    compute_nics=8,
    nic=IB_NDR,
    source="NVIDIA DGX H100 User Guide (2023): four third-generation NVSwitches, eight "
    "ConnectX-7 400 Gb/s adapters for the compute fabric",
)
SYSTEMS = (DGX_A100, DGX_H100)


@dataclass(frozen=True)
class GPUMemory:
    """A GPU's own memory (HBM): ``capacity`` bytes read or written at ``bandwidth`` bytes/s
    (both directions together: the data-sheet figure is the total the cores can move)."""

    gpu: str
    capacity: float
    bandwidth: float
    source: str


HBM_A100 = GPUMemory(
    "A100 80GB SXM",
    capacity=80 * GB,
    bandwidth=2039 * GB,
    source="NVIDIA A100 Tensor Core GPU datasheet (2021): 80GB HBM2e, 2,039 GB/s (SXM)",
)
HBM_H100 = GPUMemory(
    "H100 SXM5",
    capacity=80 * GB,
    bandwidth=3350 * GB,
    source="NVIDIA H100 Tensor Core GPU datasheet (2023): 80GB HBM3, 3.35 TB/s (SXM)",
)
GPU_MEMORY = (HBM_A100, HBM_H100)

#: Most Hopper GPUs one NVLink Switch System joins into a single NVLink domain
#: (H100 whitepaper, NVLink Switch System).
NVLINK_SWITCH_SYSTEM_MAX_GPUS = 256
#: Most GPUs fifth-generation NVLink switches join into one NVLink domain (NVIDIA NVLink
#: and NVLink Switch product page, 2024: "up to 576 GPUs"); a GB200 NVL72 rack is 72 of them.
NVLINK5_SWITCH_MAX_GPUS = 576
