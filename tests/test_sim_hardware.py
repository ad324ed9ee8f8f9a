"""The cluster presets agree with the data-sheet figures of distlab.sim.hardware."""

import pytest

from distlab.sim import hardware, preset, topology


@pytest.mark.parametrize(
    "generation,link",
    [
        (hardware.NVLINK3, topology.NVLINK3),
        (hardware.NVLINK4, topology.NVLINK4),
        (hardware.NVLINK5, topology.NVLINK5),
    ],
)
def test_nvlink_presets_are_links_times_per_link_rate(generation, link):
    assert generation.bandwidth == link.bandwidth
    assert generation.bidirectional == 2 * link.bandwidth


def test_nvlink_data_sheet_totals():
    """The figures NVIDIA prints (both directions, all links): 600 GB/s, 900 GB/s, 1.8 TB/s."""
    totals = [g.bidirectional / 1e9 for g in hardware.NVLINK]
    assert totals == [600, 900, 1800]
    assert hardware.NVLINK3.link_bandwidth == hardware.NVLINK4.link_bandwidth


@pytest.mark.parametrize(
    "port,link",
    [
        (hardware.IB_HDR, topology.IB_HDR),
        (hardware.IB_NDR, topology.IB_NDR),
        (hardware.ETHERNET_100G, topology.ETH_100G),
    ],
)
def test_network_presets_are_bits_over_eight(port, link):
    assert port.bandwidth == link.bandwidth


def test_pcie_raw_rate_is_above_the_achieved_preset():
    raw4 = hardware.PCIE4.bandwidth()
    assert raw4 == pytest.approx(31.5e9, rel=1e-3)
    assert hardware.PCIE5.bandwidth() == pytest.approx(2 * raw4)
    assert topology.PCIE4_NEAR.bandwidth < raw4
    assert hardware.PCIE4.bandwidth(lanes=8) == raw4 / 2
    with pytest.raises(ValueError, match="lanes"):
        hardware.PCIE4.bandwidth(lanes=0)


@pytest.mark.parametrize(
    "system,name", [(hardware.DGX_A100, "dgx-a100"), (hardware.DGX_H100, "dgx-h100")]
)
def test_dgx_presets_match_the_systems(system, name):
    cluster = preset(name)
    assert cluster.gpus_per_node == system.gpus
    assert cluster.nics_per_node == system.compute_nics
    assert cluster.intra.bandwidth == system.nvlink.bandwidth
    assert cluster.inter.bandwidth == system.nic.bandwidth


@pytest.mark.parametrize(
    ("memory", "name"), [(hardware.HBM_A100, "dgx-a100"), (hardware.HBM_H100, "dgx-h100")]
)
def test_hbm_matches_the_preset_gpus(memory, name):
    """The HBM figures describe the GPUs of the presets (same capacity), and a GPU moves
    far fewer bytes per second than it does FLOPs: the ridge point is well above 100."""
    cluster = preset(name)
    assert memory.capacity == cluster.gpu_memory_bytes
    assert cluster.gpu_peak_flops / memory.bandwidth > 100
