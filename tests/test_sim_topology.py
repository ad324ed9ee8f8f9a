"""Which link a message takes, and which ports it shares, on every preset."""

import json

import pytest

from distlab.sim.topology import (
    PRESETS,
    ClusterSpec,
    Link,
    cluster_from_dict,
    load_cluster,
    preset,
    shared_bus,
    uniform_cluster,
)


def test_dgx_h100_nvswitch_inside_node_gives_each_gpu_its_own_ports():
    c = preset("dgx-h100", nodes=2)
    r = c.route(0, 5)
    assert r.kind == "nvlink"
    assert r.alpha == c.intra.alpha
    assert r.ports == (("gpu0 out", c.intra.bandwidth), ("gpu5 in", c.intra.bandwidth))
    # two messages between disjoint pairs share nothing
    assert not {p for p, _ in c.route(1, 2).ports} & {p for p, _ in r.ports}


def test_dgx_h100_across_nodes_uses_the_rail_nics_at_400_gbit():
    c = preset("dgx-h100", nodes=2)
    r = c.route(3, 8 + 3)
    assert r.kind == "network"
    assert r.ports == (("node0 nic3 out", 50e9), ("node1 nic3 in", 50e9))
    assert c.inter.bandwidth * 8 == 400e9  # 400 Gb/s = 50 GB/s


def test_one_nic_per_node_is_shared_by_every_gpu_of_the_node():
    c = preset("ethernet", nodes=2)
    assert {c.route(g, 4 + g).ports[0][0] for g in range(4)} == {"node0 nic0 out"}


def test_nics_are_shared_by_neighbouring_gpus():
    c = ClusterSpec(
        "x",
        nodes=2,
        gpus_per_node=8,
        intra=Link("nv", 1e-6, 1e11),
        inter=Link("ib", 5e-6, 1e10),
        nics_per_node=2,
    )
    assert [c.nic_of(g) for g in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_pcie_box_distance_inside_the_node_matters():
    c = preset("pcie-8gpu")
    near, far = c.route(0, 3), c.route(0, 4)
    assert near.kind == "pcie" and near.alpha == c.intra.alpha
    assert far.kind == "pcie-far" and far.alpha == c.far_intra.alpha
    assert min(bw for _, bw in far.ports) == c.far_intra.bandwidth < c.intra.bandwidth
    # every message from switch 0 to switch 1 shares the same crossing
    assert far.ports[1][0] == c.route(1, 6).ports[1][0]
    assert far.ports[1][0] != c.route(4, 0).ports[1][0]  # the other direction is separate


def test_gb200_nvl72_nvlink_domain_spans_trays():
    c = preset("gb200-nvl72")
    assert c.world_size == 72 and c.nvlink_domain_gpus == 72
    assert c.route(0, 71).kind == "nvlink"
    two = preset("gb200-nvl72", nodes=36)
    assert two.route(0, 72).kind == "network"


def test_bus_shares_one_port_inside_the_node():
    c = shared_bus(4, Link("loopback", 1e-5, 1e9))
    assert c.route(0, 1).ports == c.route(2, 3).ports == (("node0 bus", 1e9),)
    assert c.route(1, 1).kind == "local" and c.route(1, 1).ports == ()


def test_uniform_cluster_is_one_switch():
    c = uniform_cluster(5, Link("u", 1e-6, 1e9))
    assert c.world_size == 5
    assert {c.route(a, b).kind for a in range(5) for b in range(5) if a != b} == {"nvlink"}


def test_every_preset_routes_every_pair():
    for name in PRESETS:
        c = preset(name, nodes=2)
        kinds = {c.link_class(0, b) for b in range(c.world_size)}
        assert "local" in kinds and kinds <= {"local", "nvlink", "pcie", "pcie-far", "network"}


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="dgx-z100.*known presets"):
        preset("dgx-z100")
    with pytest.raises(ValueError, match=r"GPU must be an integer in 0..15, got 16"):
        preset("dgx-h100", nodes=2).route(0, 16)
    with pytest.raises(ValueError, match="nodes must be an integer >= 1"):
        preset("dgx-h100", nodes=0)
    with pytest.raises(ValueError, match="intra_kind"):
        cluster_from_dict({"preset": "dgx-h100", "intra_kind": "wormhole"})
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        Link("x", 1e-6, 0)


def test_custom_cluster_from_yaml_and_json(tmp_path):
    yaml_text = """
name: lab
nodes: 3
gpus_per_node: 2
intra: {name: pcie, alpha: 5.0e-6, bandwidth: 2.0e10}
inter: {name: 25GbE, alpha: 3.0e-5, bandwidth: 3.125e9}
nics_per_node: 1
intra_kind: bus
"""
    (tmp_path / "lab.yaml").write_text(yaml_text)
    c = load_cluster(tmp_path / "lab.yaml")
    assert (c.world_size, c.intra_kind, c.inter.bandwidth) == (6, "bus", 3.125e9)
    assert c.route(0, 1).kind == "bus" and c.route(0, 2).kind == "network"
    (tmp_path / "h.json").write_text(json.dumps({"preset": "dgx-h100", "nodes": 16}))
    assert load_cluster(tmp_path / "h.json") == preset("dgx-h100", nodes=16)
