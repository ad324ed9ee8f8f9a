"""The TP roofline and TP + FSDP (distlab.calc.tp_roofline) against its derivations.

Every closed form of the module docstring is checked against the search over the
library's own volumes (calc.comm) and FLOPs (calc.flops), and the planner's tp
choices against max_useful_tp.
"""

from __future__ import annotations

import math

import pytest

from distlab.calc import tp_roofline as r
from distlab.calc.comm import fsdp_comm, tensor_parallel_comm
from distlab.calc.planner import group_link, plan
from distlab.calc.transformer import ModelSpec, model_preset
from distlab.sim.topology import IB_NDR, NVLINK4, Link, preset

GPT = ModelSpec("gpt-8k", layers=4, hidden=8192, heads=64, vocab=50257, seq_len=2048)
NO_LATENCY = Link("bandwidth only", alpha=0.0, bandwidth=450e9)


def test_layer_time_uses_the_library_volume_and_flops():
    step = r.tp_layer_time(GPT, tp=4, link=NVLINK4, peak_flops=1e15, micro_batch=2)
    volume = tensor_parallel_comm(seq_len=2048, micro_batch=2, hidden=8192, layers=1, tp=4)
    assert step.comm_bytes == volume.total
    assert step.comm_s == volume.time_on(NVLINK4)
    per_token = 6 * GPT.params_per_layer + 12 * 2048 * 8192
    assert step.flops == pytest.approx(per_token * 2 * 2048 / 4)
    assert step.compute_s == pytest.approx(step.flops / 1e15)


def test_closed_form_constants_come_from_the_library_volumes():
    # four all-reduces of h e bytes per token, 2 (t-1)/t each: 8 h e without (t-1)/t
    assert r.tp_bytes_per_token(8192, bytes_per_element=2) == 8 * 8192 * 2
    # FSDP: two all-gathers and a reduce-scatter of e bytes per parameter: 3 e
    assert r.fsdp_bytes_per_param(bytes_per_element=4) == 3 * 4


def test_max_useful_tp_is_where_compute_stops_covering_communication():
    kwargs = {"link": NVLINK4, "peak_flops": r.H100_PEAK_FLOPS}
    t = r.max_useful_tp(GPT, **kwargs)
    assert not r.tp_layer_time(GPT, tp=t, **kwargs).comm_bound
    assert r.tp_layer_time(GPT, tp=t + 1, **kwargs).comm_bound


def test_without_latency_the_search_is_the_closed_form_and_tokens_cancel():
    bound = r.bandwidth_bound_tp(GPT, bandwidth=450e9, peak_flops=r.H100_PEAK_FLOPS)
    for b in (1, 8):
        found = r.max_useful_tp(GPT, link=NO_LATENCY, peak_flops=r.H100_PEAK_FLOPS, micro_batch=b)
        assert found == math.floor(bound)
    # a GPT layer: 1 + (9h + 1.5 s) W / (e C), about 1 + (9/8) F W / C
    h, s, w, c = 8192, 2048, 450e9, r.H100_PEAK_FLOPS
    assert bound == pytest.approx(1 + (9 * h + 1.5 * s) * w / (2 * c), rel=1e-3)  # + biases
    assert bound == pytest.approx(1 + 9 / 8 * (4 * h) * w / c, rel=0.05)


def test_latency_lowers_max_useful_tp_for_small_batches():
    peak = r.H100_PEAK_FLOPS
    small = r.max_useful_tp(GPT, link=NVLINK4, peak_flops=peak, micro_batch=1)
    large = r.max_useful_tp(GPT, link=NVLINK4, peak_flops=peak, micro_batch=64)
    bound = r.bandwidth_bound_tp(GPT, bandwidth=NVLINK4.bandwidth, peak_flops=peak)
    assert small < large <= math.floor(bound)


def test_h100_nvlink_covers_a_node_and_infiniband_barely_two():
    limits = r.max_useful_tp_on_h100(GPT)
    assert set(limits) == {"NVLink 4", "InfiniBand NDR"}
    assert limits["NVLink 4"] >= 8  # the whole 8-GPU DGX H100 node
    assert limits["InfiniBand NDR"] <= 3
    assert r.H100_LINKS == {"NVLink 4": NVLINK4, "InfiniBand NDR": IB_NDR}


def test_forward_only_counts_the_forward_third_and_its_two_all_reduces():
    both = r.tp_layer_time(GPT, tp=4, link=NVLINK4, peak_flops=1e15, micro_batch=2)
    forward = r.tp_layer_time(
        GPT, tp=4, link=NVLINK4, peak_flops=1e15, micro_batch=2, passes="forward"
    )
    assert (both.passes, forward.passes) == ("forward_backward", "forward")
    # the forward is 2P + 4 s h of the 6P + 12 s h; two of the four all-reduces
    per_token = 2 * GPT.params_per_layer + 4 * 2048 * 8192
    assert forward.flops == pytest.approx(per_token * 2 * 2048 / 4)
    assert forward.flops == pytest.approx(both.flops / 3)
    volume = tensor_parallel_comm(seq_len=2048, micro_batch=2, hidden=8192, layers=1, tp=4)
    (part,) = r.tp_volume(seq_len=2048, micro_batch=2, hidden=8192, tp=4, passes="forward").parts
    assert part == volume.parts[0] and part.what == "forward all-reduce" and part.count == 2
    assert forward.comm_bytes == volume.total / 2
    assert forward.comm_s == pytest.approx(volume.time_on(NVLINK4) / 2)
    assert r.tp_bytes_per_token(8192, passes="forward") == 4 * 8192 * 2
    sp = r.tp_volume(
        seq_len=2048, micro_batch=2, hidden=8192, tp=4, passes="forward", sequence_parallel=True
    )
    assert sp.total == forward.comm_bytes and sp.messages == part.messages


def test_forward_only_closed_form_and_the_sources_f_w_over_c():
    h, s, w, c = 8192, 2048, 450e9, r.H100_PEAK_FLOPS
    forward = r.bandwidth_bound_tp(GPT, bandwidth=w, peak_flops=c, passes="forward")
    both = r.bandwidth_bound_tp(GPT, bandwidth=w, peak_flops=c)
    p = GPT.params_per_layer
    assert forward == pytest.approx(1 + (2 * p + 4 * s * h) * w / (4 * h * 2 * c))
    assert both == pytest.approx(1 + (6 * p + 12 * s * h) * w / (8 * h * 2 * c))
    found = r.max_useful_tp(GPT, link=NO_LATENCY, peak_flops=c, passes="forward")
    assert found == math.floor(forward)
    # Austin et al.'s Y < F W / C (one MLP's forward, bf16), and the two factors around it
    rule = r.mlp_forward_tp_bound(GPT, bandwidth=w, peak_flops=c)
    assert rule == pytest.approx(4 * h * w / c)
    assert r.mlp_forward_tp_bound(GPT, bandwidth=w, peak_flops=c, bytes_per_element=1) == 2 * rule
    assert (forward - 1) / rule == pytest.approx(3 / 4, rel=0.05)  # + attention's all-reduce
    assert (both - 1) / rule == pytest.approx(9 / 8, rel=0.05)  # x 3/2 for the backward
    assert (both - 1) / (forward - 1) == pytest.approx(3 / 2)


def test_the_h100_numbers_the_course_quotes():
    """The module docstring, notebook 13 and the sharding-overlap cards quote these."""
    peak = r.H100_PEAK_FLOPS

    def bounds(model, passes):
        return {
            name: round(
                r.bandwidth_bound_tp(
                    model, bandwidth=link.bandwidth, peak_flops=peak, passes=passes
                ),
                2,
            )
            for name, link in r.H100_LINKS.items()
        }

    assert bounds("70B", "forward_backward") == {"NVLink 4": 20.22, "InfiniBand NDR": 3.14}
    assert bounds("70B", "forward") == {"NVLink 4": 13.81, "InfiniBand NDR": 2.42}
    assert bounds("175B", "forward_backward") == {"NVLink 4": 26.86, "InfiniBand NDR": 3.87}
    assert bounds("175B", "forward") == {"NVLink 4": 18.24, "InfiniBand NDR": 2.92}
    useful = {
        (model, passes): tuple(r.max_useful_tp_on_h100(model, passes=passes).values())
        for model in ("7B", "70B", "175B")
        for passes in r.PASSES
    }
    assert useful == {
        ("7B", "forward_backward"): (8, 2),
        ("7B", "forward"): (6, 1),  # forward only, no TP pays across nodes
        ("70B", "forward_backward"): (16, 3),
        ("70B", "forward"): (12, 2),
        ("175B", "forward_backward"): (20, 3),
        ("175B", "forward"): (14, 2),
    }
    # t = 16 or 20 "over NVLink" leaves a DGX H100's NVLink domain; 70B's KV heads cap t at 8
    assert preset("dgx-h100").nvlink_domain_gpus == 8
    assert model_preset("70B").kv_heads == 8


@pytest.mark.parametrize(("model", "nodes", "batch"), [("7B", 2, 256), ("70B", 8, 1024)])
def test_planner_tp_stays_within_max_useful_tp(model, nodes, batch):
    cluster = preset("dgx-h100", nodes=nodes)
    chosen = plan(model, cluster, global_batch=batch)
    layout = chosen.best.layout
    link = group_link(cluster, stride=1, size=layout.tp) or cluster.intra
    limit = r.max_useful_tp(
        model,
        link=link,
        peak_flops=cluster.gpu_peak_flops,
        micro_batch=layout.micro_batch,
        compute_efficiency=chosen.assumptions.compute_efficiency,
    )
    assert layout.tp <= limit


def test_tp_fsdp_parts_are_the_library_volumes():
    split = r.tp_fsdp_comm(GPT, n_gpus=64, tp=4, tokens_per_gpu=1024)
    assert (split.tp, split.fsdp) == (4, 16)
    tp = tensor_parallel_comm(seq_len=4 * 1024, micro_batch=1, hidden=8192, layers=4, tp=4)
    fsdp = fsdp_comm(4 * GPT.params_per_layer / 4, dp=16)
    assert split.tp_bytes == tp.total
    assert split.fsdp_bytes == fsdp.total
    assert split.total == tp.total + fsdp.total
    pure = r.tp_fsdp_comm(GPT, n_gpus=64, tp=1, tokens_per_gpu=1024)
    assert pure.tp_bytes == 0


def test_tp_lowers_fsdp_communication_only_below_the_batch_bound():
    bound = r.tp_fsdp_batch_bound(GPT, tp=2)
    assert bound == pytest.approx(3 * GPT.params_per_layer / (8 * 8192 * 2))
    n = 4096  # large FSDP groups, as the bound assumes

    def gain(tokens):
        pure = r.tp_fsdp_comm(GPT, n_gpus=n, tp=1, tokens_per_gpu=tokens).total
        return pure - r.tp_fsdp_comm(GPT, n_gpus=n, tp=2, tokens_per_gpu=tokens).total

    assert gain(int(bound * 0.9)) > 0
    assert gain(int(bound * 1.1)) < 0


def test_best_split_is_the_divisor_nearest_the_optimum():
    tokens = 1024
    best = r.best_tp_fsdp_split(GPT, n_gpus=4096, tokens_per_gpu=tokens)
    optimum = r.optimal_tp(GPT, tokens_per_gpu=tokens)
    assert optimum == pytest.approx(math.sqrt(3 * GPT.params_per_layer / (8 * tokens * 8192)))
    assert best.tp in (2 ** math.floor(math.log2(optimum)), 2 ** math.ceil(math.log2(optimum)))
    every = [r.tp_fsdp_comm(GPT, n_gpus=4096, tp=t, tokens_per_gpu=tokens) for t in (1, 2, 4, 8)]
    assert best.total <= min(s.total for s in every)
    capped = r.best_tp_fsdp_split(GPT, n_gpus=4096, tokens_per_gpu=tokens, max_tp=2)
    assert capped.tp == 2


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="tp=3 must divide n_gpus=64"):
        r.tp_fsdp_comm(GPT, n_gpus=64, tp=3, tokens_per_gpu=8)
    with pytest.raises(ValueError, match="compute_efficiency"):
        r.tp_layer_time(GPT, tp=2, link=NVLINK4, peak_flops=1e15, compute_efficiency=0)
    with pytest.raises(ValueError, match="tp must be >= 2"):
        r.tp_fsdp_batch_bound(GPT, tp=1)
    with pytest.raises(TypeError, match="ModelSpec"):
        r.layer_flops_per_token(42)
    with pytest.raises(ValueError, match="passes 'backward'.*'forward_backward', 'forward'"):
        r.max_useful_tp(GPT, link=NVLINK4, peak_flops=1e15, passes="backward")
    assert r.layer_flops_per_token("70B") == r.layer_flops_per_token(model_preset("70B"))
