"""place(): where ranks go, the rules it keeps, the score, and the errors it gives."""

import numpy as np
import pytest

from distlab.calc import comm
from distlab.calc.moe import moe_all_to_all_comm
from distlab.core.layout import Layout
from distlab.placement import Job, Workload, compare_placements, place, rank_groups
from distlab.placement.cluster import ROUTE_KINDS, edge_costs, resolve_cluster
from distlab.placement.score import (
    MOE_CAPACITY_FACTOR,
    MOE_TOP_K,
    dimension_volumes,
)
from distlab.sim.topology import PRESETS, preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_edge_costs_agree_with_cluster_route(name):
    cluster = preset(name, nodes=4 if name != "gb200-nvl72" else 36)
    rng = np.random.default_rng(0)
    for src, dst in rng.integers(0, cluster.world_size, size=(200, 2)).tolist():
        one = edge_costs(cluster, np.array([src]), np.array([dst]))  # alone: no contention
        route = cluster.route(src, dst)
        assert ROUTE_KINDS[int(one.kind[0])] == route.kind
        assert one.alpha[0] == route.alpha
        if route.ports:
            assert one.bandwidth[0] == min(bw for _, bw in route.ports)


def test_shared_nic_divides_bandwidth():
    cluster = preset("ethernet", nodes=2)  # 4 GPUs share one NIC per node
    costs = edge_costs(cluster, np.arange(4), np.arange(4) + 4)
    assert np.allclose(costs.bandwidth, cluster.inter.bandwidth / 4)


def test_hierarchical_keeps_tp_in_node_and_spreads_pp_over_nodes():
    cluster = preset("dgx-h100", nodes=16)
    p = place(Layout(tp=8, pp=4, dp=4), cluster)
    assert p.violations() == []
    tp_nodes = p.gpu_groups("tp") // 8
    assert (tp_nodes == tp_nodes[:, :1]).all()
    pp_nodes = p.gpu_groups("pp") // 8
    assert all(len(set(row)) == 4 for row in pp_nodes.tolist())
    assert p.groups() == rank_groups(128, tp=8, pp=4, dp=4, order=p.order)
    assert "PROBLEM" not in p.explain()


def test_tp_time_is_the_ring_closed_form_on_nvlink():
    cluster = preset("dgx-a100", nodes=1)
    w = Workload(layers=2, hidden=1024, seq_len=512)
    p = place(Job("tp8", Layout(tp=8), workload=w), cluster)
    part = p.score().part("tp")
    n_bytes = 512 * 1024 * 2
    one_call = 2 * 7 * cluster.intra.alpha + 2 * 7 / 8 * n_bytes / cluster.intra.bandwidth
    assert part.calls == 4 * 2
    assert part.slowest_link == "nvlink"
    assert part.time_per_call_s == pytest.approx(one_call)
    assert p.score().total == pytest.approx(part.time_s)


def test_tp_across_nodes_costs_more_than_everything_hierarchical_does():
    cluster = preset("dgx-h100", nodes=8)
    rows = {
        label: (pl, sc) for label, pl, sc in compare_placements(Layout(tp=8, pp=2, dp=4), cluster)
    }
    best = rows["hierarchical"][1]
    for label in ("TP outermost", "random"):
        placement, score = rows[label]
        assert placement.violations(), label
        assert score.part("tp").slowest_link == "network"
        # NVLink4 450 GB/s vs NDR 50 GB/s: TP traffic slows by about the bandwidth ratio
        assert score.part("tp").time_s > 5 * best.part("tp").time_s
        assert score.total > best.total
    assert best.total <= rows["rank order"][1].total


def test_order_is_chosen_by_score():
    cluster = preset("dgx-h100", nodes=8)
    layout = Layout(tp=2, pp=4, dp=8, micro_batches=8)
    chosen = place(layout.with_(order="pp-dp-ep-cp-tp"), cluster)  # the layout's order is ignored
    assert chosen.layout == layout.with_(order=chosen.order)  # the placement carries the choice
    totals = {}
    for order in ("tp-cp-ep-pp-dp", "tp-cp-ep-dp-pp"):
        fixed = place(layout.with_(order=order), cluster, choose_order=False)
        assert fixed.order == order
        totals[order] = fixed.score().total
    assert chosen.score().total == min(totals.values())
    assert place(Job("j", chosen.layout), cluster, choose_order=False).order == chosen.order


def test_pcie_box_keeps_tp_under_one_switch():
    cluster = preset("pcie-8gpu")
    good = place(Layout(tp=4, dp=2), cluster)
    assert good.link_summary()["tp"] == {"pcie": 2}
    bad = place(Layout(tp=4, dp=2, order="dp-tp-cp-ep-pp"), cluster, strategy="rank-order")
    assert bad.link_summary()["tp"] == {"pcie-far": 2} and bad.order == "dp-tp-cp-ep-pp"
    assert bad.score().part("tp").time_s > good.score().part("tp").time_s


def test_ragged_allocation_rank_order_splits_tp_hierarchical_does_not():
    cluster = preset("dgx-h100", nodes=3)
    gpus = [0, 1, 2] + list(range(8, 13)) + list(range(16, 24))  # 3 + 5 + 8 free GPUs
    job = Layout(tp=2, dp=6)
    naive = place(job, cluster, gpus=gpus, strategy="rank-order")
    assert any("TP groups span" in v for v in naive.violations())
    good = place(job, cluster, gpus=gpus)
    assert good.violations() == []
    assert 2 not in good.gpu_of_rank.tolist() and 12 not in good.gpu_of_rank.tolist()


def test_nvl72_tp_may_span_trays_inside_the_domain():
    cluster = preset("gb200-nvl72", nodes=36)  # two domains of 18 trays x 4 GPUs
    p = place(Layout(tp=8, dp=18), cluster)
    assert p.violations() == []
    assert p.score().part("tp").slowest_link == "nvlink"
    assert len(np.unique(p.gpu_groups("tp")[0] // 4)) == 2  # one TP group, two trays
    # 72 GPUs hold four TP groups of 16, with 8 left over: 9 groups do not fit in 144 GPUs
    with pytest.raises(ValueError, match="only 128 of the 144 GPUs"):
        place(Layout(tp=16, dp=9), cluster)


def test_ep_stays_in_node_when_it_fits():
    cluster = preset("dgx-h100", nodes=4)
    p = place(Layout(tp=2, dp=16, ep=4), cluster)
    ep_nodes = p.gpu_groups("ep") // 8
    assert (ep_nodes == ep_nodes[:, :1]).all()
    assert p.score().part("ep").slowest_link == "nvlink"


def test_volumes_scale_with_degrees():
    w = Workload()
    volumes = dimension_volumes(Layout(tp=4, pp=2, dp=2, cp=2, micro_batches=8), w)
    assert all(len(v.parts) == 1 for v in volumes.values())  # merged; ZeRO stage 0
    vols = {name: v.parts[0] for name, v in volumes.items()}
    assert list(vols) == ["tp", "cp", "pp", "dp"]
    act = 1 * w.seq_len / 2 * w.hidden * w.bytes_per_value  # micro-batch size 1
    assert vols["tp"].payload_bytes == act and vols["tp"].count == 4 * 16 * 8
    assert vols["pp"].count == 2 * 8 and vols["pp"].payload_bytes == act / 4  # over tp
    assert vols["dp"].payload_bytes == pytest.approx(w.params / 8 * 2)
    assert vols["cp"].count == 3 * 1 * 16 * 8 and vols["cp"].payload_bytes == 2 * act


@pytest.mark.parametrize(
    ("layout", "workload"),
    [
        (Layout(tp=2, dp=8, ep=4, micro_batches=8), Workload(layers=32, hidden=4096)),
        (Layout(dp=16, ep=8, micro_batches=2), Workload(layers=8, hidden=1024, seq_len=1000)),
        (Layout(tp=2, cp=2, dp=4, pp=2, ep=8, micro_batch=3, micro_batches=8),
         Workload(layers=6, seq_len=777)),
    ],
)  # fmt: skip
def test_expert_parallel_bytes_are_the_calculators(layout, workload):
    """One formula for EP: the score prices calc.moe's all-to-alls, capacity padding included."""
    calc = moe_all_to_all_comm(
        tokens=layout.micro_batch * -(-workload.seq_len // layout.cp),
        hidden=workload.hidden,
        num_experts=layout.ep,
        ep=layout.ep,
        top_k=MOE_TOP_K,
        capacity_factor=MOE_CAPACITY_FACTOR,
        moe_layers=-(-workload.layers // layout.pp),
        micro_batches=layout.micro_batches,
        bytes_per_element=workload.bytes_per_value,
    )
    assert dimension_volumes(layout, workload)["ep"].total == calc.total
    cost = place(layout, preset("dgx-h100", nodes=layout.world_size // 8 or 1)).score(workload)
    ep = cost.part("ep")
    assert ep.bytes_sent == pytest.approx(calc.total)
    assert ep.n_bytes * ep.calls == pytest.approx(
        sum(p.payload_bytes * p.count for p in calc.parts)
    )
    assert ep.n_bytes > layout.micro_batch * workload.seq_len / layout.cp * workload.hidden * 2


def test_score_prices_the_calculators_messages_and_bytes():
    """Every dimension's time per call is calc's messages x alpha + bytes sent / bandwidth."""
    job = Job(
        "moe", Layout(tp=2, cp=2, dp=4, pp=2, ep=2, zero_stage=3), workload=Workload(layers=4)
    )
    for part in place(job, preset("dgx-h100", nodes=4)).score().parts:
        rounds = 2 if part.collective == "all_reduce" else 1  # ring: (n-1) messages per round
        sent = part.bytes_sent / part.calls
        want = rounds * (part.group_size - 1) * part.alpha + sent / part.bandwidth
        if part.collective == "send_recv":  # one message of the whole payload
            want = part.alpha + part.n_bytes / part.bandwidth
        assert part.time_per_call_s == pytest.approx(want), part


def test_context_parallel_volume_is_ring_attention():
    volume = comm.context_parallel_comm(
        seq_len=100, micro_batch=2, hidden=8, layers=3, cp=4, micro_batches=5
    )
    kv = 2 * 100 * 2 * 8 * 2  # K and V blocks of the rank's tokens, bf16
    assert {p.payload_bytes for p in volume.parts} == {kv}
    assert volume.messages == 3 * 3 * 3 * 5  # 3 (cp-1) per layer and micro-batch
    assert volume.total == kv * volume.messages
    assert comm.context_parallel_comm(seq_len=1, micro_batch=1, hidden=1, layers=1, cp=1).total == 0


def test_zero_stages_change_only_data_parallel_traffic():
    cluster = preset("dgx-h100", nodes=4)
    ddp = place(Layout(tp=8, dp=4, micro_batches=8), cluster).score()
    zero3 = place(Layout(tp=8, dp=4, micro_batches=8, zero_stage=3), cluster).score()
    assert ddp.breakdown()["tp"] == zero3.breakdown()["tp"]
    assert zero3.breakdown()["dp"] > ddp.breakdown()["dp"]  # 3 x 8 micro-batches of gathers


def test_random_placement_is_seeded():
    cluster = preset("dgx-h100", nodes=4)
    a = place(Layout(tp=4, dp=8), cluster, strategy="random", seed=3)
    b = place(Layout(tp=4, dp=8), cluster, strategy="random", seed=3)
    assert a.gpu_of_rank.tolist() == b.gpu_of_rank.tolist()


def test_hundred_thousand_gpus_are_placed_without_violations():
    """The time (target < 1 s) is measured by benchmarks/placement_scale.py, not here."""
    cluster = preset("dgx-h100", nodes=12_500)
    p = place(Layout(tp=8, pp=8, dp=1562), cluster)
    assert p.violations() == []


@pytest.mark.parametrize(
    "job, cluster, match",
    [
        (Layout(tp=8, dp=8), preset("dgx-h100", nodes=4), "needs 64 GPUs"),
        (Layout(tp=16), preset("dgx-h100", nodes=4), "tp=16 is larger than the 8 GPUs"),
        (Layout(tp=8), preset("pcie-8gpu"), None),
        (Layout(tp=6, dp=2), preset("gb200-nvl72"), "multiple of gpus_per_node=4"),
        (Layout(tp=2, dp=4, order="dp-tp-cp-ep-pp"), preset("dgx-h100"), "inside TP"),
    ],
)
def test_bad_placements_raise_value_error(job, cluster, match):
    if match is None:
        assert place(job, cluster).violations() == []
        return
    with pytest.raises(ValueError, match=match):
        place(job, cluster, choose_order=False)


def test_unknown_preset_and_bad_job():
    with pytest.raises(ValueError, match="unknown cluster preset"):
        resolve_cluster("dgx-z900")
    with pytest.raises(TypeError, match="layout must be a distlab.core.layout.Layout"):
        Job("old", {"tp": 2})
    with pytest.raises(TypeError, match="a Job or a distlab.core.layout.Layout"):
        place({"tp": 2}, "dgx-h100")
    with pytest.raises(ValueError, match="min_dp"):
        Job("elastic", Layout(dp=2), elastic=True, min_dp=3)
    with pytest.raises(ValueError, match="unknown strategy"):
        place(Layout(), "dgx-h100", strategy="best")


def test_custom_cluster_from_dict_and_yaml(tmp_path):
    spec = {"preset": "dgx-a100", "nodes": 2, "gpus_per_node": 4}
    assert resolve_cluster(spec).world_size == 8
    path = tmp_path / "c.yaml"
    path.write_text("preset: dgx-h100\nnodes: 3\n")
    assert resolve_cluster(path).world_size == 24
    assert place(Layout(tp=4, dp=2), spec).violations() == []


# --------------------------------------------- busy clusters: the best known placement ---
BUSY_FREE = [5, 6, 7, *range(8, 16), 16, 17, 18, 21, 22, *range(24, 32)]  # notebook 09, Ex. 2


def _best_by_search(job, cluster, free):
    """The cheapest placement over every arrangement of whole TP groups (blocks of ``tp`` free
    GPUs of one node, as whole_tp_slots cuts them) on the job's groups, in both rank orders."""
    import itertools

    from distlab.placement import Placement
    from distlab.placement.placer import HIERARCHICAL_ORDERS, whole_tp_slots, with_order

    tp = job.layout.tp
    slots = whole_tp_slots(cluster, np.sort(np.asarray(free)), tp)
    blocks = [slots[i : i + tp] for i in range(0, len(slots), tp)]
    best = np.inf
    for arrangement in itertools.permutations(blocks, job.layout.world_size // tp):
        gpus = np.concatenate(arrangement)
        for order in HIERARCHICAL_ORDERS:
            best = min(
                best, Placement(with_order(job, order), cluster, "search", gpus).score().total
            )
    return best


def test_busy_cluster_fills_the_two_free_nodes():
    """Notebook 09's busy cluster: the two free nodes hold the job, only the pipeline crosses
    (69.76 ms), not the first whole TP groups in topology order over three nodes (98.40 ms)."""
    cluster, job = (
        preset("dgx-h100", nodes=4),
        Job("llm", Layout(tp=4, pp=2, dp=2, micro_batches=8)),
    )
    for choose_order in (True, False):
        p = place(job, cluster, gpus=BUSY_FREE, choose_order=choose_order)
        assert p.nodes_used() == [1, 3], p.gpu_of_rank
        assert p.score().total * 1e3 == pytest.approx(69.7577, abs=1e-3)
        assert not p.violations()
    from distlab.placement import Placement
    from distlab.placement.placer import whole_tp_slots

    first = whole_tp_slots(cluster, np.array(BUSY_FREE), 4)[:16]  # nodes 1, 2 and 3
    spread = Placement(job, cluster, "first whole TP groups", first).score().total * 1e3
    assert spread == pytest.approx(98.397, abs=1e-3)


@pytest.mark.slow
def test_busy_clusters_match_an_exhaustive_search():
    """On small busy clusters (random free GPUs, jobs of 4-16 GPUs), place() scores the same
    as the cheapest arrangement of whole TP groups found by trying them all."""
    import math
    import random

    rng = random.Random(7)
    layouts = [Layout(tp=2, pp=2, dp=2, micro_batches=8), Layout(tp=4, pp=2, dp=2, micro_batches=8),
               Layout(tp=2, pp=2, dp=4, micro_batches=8), Layout(tp=4, dp=3, micro_batches=8),
               Layout(tp=2, pp=4, micro_batches=8), Layout(tp=8, pp=2, micro_batches=8),
               Layout(tp=1, pp=2, dp=2, micro_batches=8)]  # fmt: skip
    cases = [("dgx-h100", 4, BUSY_FREE, layouts[1])]
    while len(cases) < 14:
        cluster = preset(rng.choice(["dgx-h100", "dgx-a100"]), nodes=rng.choice([2, 3, 4]))
        layout = rng.choice(layouts)
        free = [g for g in range(cluster.world_size) if rng.random() < 0.7]
        groups = sum(n // layout.tp for n in np.bincount(np.array(free) // 8))
        need = layout.world_size // layout.tp
        if groups >= need and math.perm(groups, need) <= 120:
            cases.append((cluster.name, cluster.nodes, free, layout))
    for name, nodes, free, layout in cases:
        cluster, job = preset(name, nodes=nodes), Job("j", layout)
        got = place(job, cluster, gpus=free).score().total
        best = _best_by_search(job, cluster, free)
        assert got <= best * (1 + 1e-9), (name, nodes, layout.label(), free, got * 1e3, best * 1e3)
