"""The parallelism planner and the model presets it plans for."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from distlab.calc import flops
from distlab.calc.memory import peak_bytes
from distlab.calc.planner import PlannerAssumptions, group_link, plan
from distlab.calc.transformer import ModelSpec, gpt_shape_for, model_preset
from distlab.sim.topology import preset


@pytest.mark.parametrize(
    ("name", "n_params"),
    [
        ("1B", 1_011_781_632),  # Pythia-1B (Biderman et al. 2023)
        ("7B", 6_738_415_616),  # LLaMA-2 7B, as the released checkpoint counts
        ("13B", 13_015_864_320),
        ("70B", 68_976_648_192),
    ],
)
def test_preset_parameter_counts(name, n_params):
    assert model_preset(name).n_params == n_params


def test_gpt3_preset_and_layer_formula():
    gpt3 = model_preset("175b")
    assert gpt3.params_per_layer == 12 * 12288**2 + 13 * 12288  # Narayanan et al. 2021, Sec. 5.1
    assert gpt3.n_params / 1e9 == pytest.approx(174.6, abs=0.05)


def test_gpt_shape_for_recovers_gpt3():
    shape = gpt_shape_for(175e9)
    assert (shape.layers, shape.hidden, shape.heads) == (96, 12288, 96)


def _plan_small(**kw):
    return plan("7B", preset("dgx-h100", nodes=2), global_batch=32, **kw)


def test_every_layout_obeys_the_rules_and_fits():
    result = _plan_small()
    spec, n_gpus = result.model, result.cluster.world_size
    capacity = result.cluster.gpu_memory_bytes * (1 - result.assumptions.memory_headroom)
    assert result.candidates and result.n_enumerated == len(result.candidates) + result.n_too_big
    for e in result.candidates:
        c = e.layout
        assert c.tp * c.pp * c.dp == n_gpus
        assert spec.heads % c.tp == 0 and spec.layers % c.pp == 0
        assert c.dp * c.micro_batch * c.micro_batches == 32
        assert not (c.pp > 1 and c.zero_stage > 1)
        assert e.memory.total <= capacity
        parts = e.compute_s + e.tp_comm_s + e.pp_comm_s + e.bubble_s + e.dp_comm_s
        assert parts == pytest.approx(e.step_s)


def test_enumeration_is_complete():
    # count the layouts independently: (tp, pp, b, v, zero, recompute) under the stated rules
    result = _plan_small()
    spec, n = result.model, result.cluster.world_size
    expected = 0
    for tp in (d for d in range(1, n + 1) if n % d == 0 and spec.heads % d == 0):
        for pp in (d for d in range(1, n // tp + 1) if (n // tp) % d == 0 and spec.layers % d == 0):
            dp = n // (tp * pp)
            if 32 % dp:
                continue
            local = 32 // dp
            for b in (d for d in range(1, local + 1) if local % d == 0):
                m = local // b
                for v in (1, 2, 4):
                    if v > 1 and (pp == 1 or m % pp or (spec.layers // pp) % v):
                        continue
                    zeros = [0] if dp == 1 else ([0, 1] if pp > 1 else [0, 1, 2, 3])
                    expected += len(zeros) * 3
    assert result.n_enumerated == expected


def test_ranked_by_step_time_and_estimates_are_consistent():
    result = _plan_small()
    times = [e.step_s for e in result.candidates]
    assert all(b >= a * 0.999 for a, b in itertools.pairwise(times))
    best = result.best
    model_flops = (
        flops.model_flops_per_token(result.model.n_params, layers=32, hidden=4096, seq_len=4096)
        * 32
        * 4096
    )
    assert best.mfu * best.step_s * 16 * result.cluster.gpu_peak_flops == pytest.approx(model_flops)
    c = best.layout
    again = peak_bytes(
        n_params=result.model.n_params,
        layers=32,
        hidden=4096,
        heads=32,
        seq_len=4096,
        micro_batch=c.micro_batch,
        micro_batches=c.micro_batches,
        zero_stage=c.zero_stage,
        dp=c.dp,
        tp=c.tp,
        pp=c.pp,
        sequence_parallel=c.sequence_parallel,
        recompute=c.recompute,
        schedule=c.pipeline_schedule,
        virtual_stages=c.virtual_stages,
        largest_layer_params=result.model.largest_layer_params,
    )
    assert again.total == best.memory.total


def test_70b_on_16_dgx_h100_keeps_tp_inside_a_node():
    result = plan("70B", preset("dgx-h100", nodes=16), global_batch=1024)
    best = result.best
    assert best.layout.tp <= 8
    assert "NVLink" in best.links["tp"] and "InfiniBand" in best.links["dp"]
    text = "\n".join(result.explain())
    assert "Why TP stays inside the NVLink domain" in text and "Memory per GPU" in text
    # every layout whose TP group crosses nodes is slower than the winner
    across = [e for e in result.candidates if e.layout.tp > 8]
    assert all(e.step_s > best.step_s for e in across)


def test_group_links():
    dgx = preset("dgx-h100", nodes=4)
    assert group_link(dgx, stride=1, size=1) is None
    assert group_link(dgx, stride=1, size=8) is dgx.intra
    assert group_link(dgx, stride=1, size=16) is dgx.inter
    assert group_link(dgx, stride=8, size=2) is dgx.inter
    pcie = preset("pcie-8gpu")
    assert group_link(pcie, stride=1, size=4) is pcie.intra
    assert group_link(pcie, stride=1, size=8) is pcie.far_intra
    eth = preset("ethernet", nodes=2)  # 4 GPUs share one NIC
    assert group_link(eth, stride=4, size=2).bandwidth == pytest.approx(eth.inter.bandwidth / 4)
    nvl = preset("gb200-nvl72")
    assert group_link(nvl, stride=1, size=72) is nvl.intra
    assert group_link(nvl, stride=1, size=8) is nvl.intra
    # 16-rank groups tile 72-GPU domains badly: ranks 64..79 straddle two domains
    assert group_link(nvl, stride=1, size=16) is nvl.inter
    assert group_link(preset("dgx-h100"), stride=1, size=3).name == preset("dgx-h100").inter.name


def test_more_memory_never_shrinks_the_feasible_set():
    small = _plan_small()
    big = plan("7B", replace(preset("dgx-h100", nodes=2), gpu_memory_bytes=141e9), global_batch=32)
    labels = {e.layout for e in small.candidates}
    assert labels <= {e.layout for e in big.candidates}


def test_nothing_fits_is_a_clear_error():
    result = plan("175B", preset("dgx-a100", nodes=1), global_batch=8)
    assert result.candidates == []
    with pytest.raises(ValueError, match="no layout of GPT-3 175B fits on 8 GPUs"):
        _ = result.best


def test_sixteen_thousand_gpus_are_enumerated():
    """The time (target < 2 s) is measured by benchmarks/planner_scale.py, not here."""
    cluster = preset("dgx-h100", nodes=2048)
    result = plan("175B", cluster, global_batch=4096)
    assert cluster.world_size == 16384 and result.n_enumerated > 500


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: plan("3B", preset("dgx-h100"), global_batch=8), "model preset '3B'"),
        (lambda: plan("7B", preset("dgx-h100"), global_batch=0), "global_batch"),
        (lambda: plan("7B", "dgx-h100", global_batch=8), "ClusterSpec"),
        (lambda: PlannerAssumptions(compute_efficiency=0), "compute_efficiency"),
        (lambda: PlannerAssumptions(memory_headroom=1.0), "memory_headroom"),
        (lambda: PlannerAssumptions(recipe="lion"), "recipe 'lion'"),
        (lambda: ModelSpec("x", 4, 100, 3, 10, 8), "hidden=100 is not divisible by heads=3"),
        (
            lambda: ModelSpec("x", 4, 96, 8, 10, 8, kv_heads=3),
            "heads=8 is not divisible by kv_heads=3",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize(
    ("name", "nodes"), [("1B", 1), ("7B", 1), ("13B", 2), ("70B", 8), ("175B", 32)]
)
def test_every_preset_gets_a_plan_and_mfu_stays_below_the_assumed_efficiency(name, nodes):
    result = plan(name, preset("dgx-h100", nodes=nodes), global_batch=256)
    for e in result.candidates[:50]:
        assert 0 < e.mfu <= result.assumptions.compute_efficiency


@pytest.mark.parametrize("cluster_name,nodes", [("dgx-h100", 4), ("pcie-8gpu", 2), ("ethernet", 2)])
def test_group_links_from_rank_groups(cluster_name, nodes):
    """sim's group link on placement's rank groups (lists and arrays) equals the block rule."""
    from distlab.core.ranks import group_array, rank_groups
    from distlab.sim.topology import group_link as sim_group_link

    cluster = preset(cluster_name, nodes=nodes)
    world = cluster.world_size
    for tp in (d for d in range(1, world + 1) if world % d == 0):
        for pp in (d for d in range(1, world // tp + 1) if (world // tp) % d == 0):
            dp = world // (tp * pp)
            groups = rank_groups(world, tp=tp, dp=dp, pp=pp)
            for dim, stride, size in (("tp", 1, tp), ("dp", tp, dp), ("pp", tp * dp, pp)):
                expected = group_link(cluster, stride=stride, size=size)
                assert sim_group_link(cluster, groups[dim]) == expected
                array = group_array(world, dim, tp=tp, dp=dp, pp=pp)
                assert sim_group_link(cluster, array) == expected
