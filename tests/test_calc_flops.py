"""FLOPs: the 6N rule, the Megatron-LM formula, MFU and step time."""

from __future__ import annotations

import pytest

from distlab.calc import flops
from distlab.calc.transformer import model_preset


def test_gpt3_training_compute():
    # Brown et al. 2020, Table D.1: GPT-3 175B trained on 300B tokens took 3.14e23 FLOPs;
    # the parameter count comes from the shape (Table 2.1), not a typed-in 175e9.
    n = model_preset("175B").n_params
    assert n == pytest.approx(174.6e9, rel=1e-3)
    assert flops.training_flops(n, 300e9) == pytest.approx(3.14e23, rel=2e-3)
    assert flops.training_flops_per_token(1.0) == 6.0


def test_megatron_formula_is_6n_plus_attention_plus_logits():
    # 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) == 6 * (12 l h^2) * tokens + 12 l h s * tokens + 6 h V * tokens
    b, s, n_layers, h, v = 8, 2048, 96, 12288, 51200
    tokens = b * s
    no_recompute = flops.megatron_flops_per_step(
        batch=b, seq_len=s, layers=n_layers, hidden=h, vocab=v, recompute="none"
    )
    expected = (6 * 12 * n_layers * h * h + 12 * n_layers * h * s + 6 * h * v) * tokens
    assert no_recompute == pytest.approx(expected)
    # full recompute runs the layers' forward again (1/3 more), not the logit layer
    full = flops.megatron_flops_per_step(batch=b, seq_len=s, layers=n_layers, hidden=h, vocab=v)
    assert full == pytest.approx(
        96 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (16 * n_layers * h))
    )
    logits = 6 * h * v * tokens
    assert (full - logits) / (no_recompute - logits) == pytest.approx(4 / 3)


def test_recompute_overheads():
    assert flops.recompute_overhead("none") == 0
    assert flops.recompute_overhead("full") == pytest.approx(1 / 3)
    s, h = 2048, 12288
    sel = flops.recompute_overhead("selective", seq_len=s, hidden=h)
    b, n_layers, v = 1, 96, 1
    base = (
        flops.megatron_flops_per_step(
            batch=b, seq_len=s, layers=n_layers, hidden=h, vocab=v, recompute="none"
        )
        - 6 * h * v * b * s
    )
    extra = (
        flops.megatron_flops_per_step(
            batch=b, seq_len=s, layers=n_layers, hidden=h, vocab=v, recompute="selective"
        )
        - 6 * h * v * b * s
        - base
    )
    assert sel == pytest.approx(extra / base)
    assert sel < 0.01  # recomputing only the attention core costs under 1% for GPT-3's shape
    with pytest.raises(ValueError, match="seq_len and hidden"):
        flops.recompute_overhead("selective")


def test_model_flops_per_token_palm():
    # PaLM Appendix B: 6N + 12 L H Q T with H heads of size Q (H Q = hidden)
    assert flops.model_flops_per_token(1e9, layers=24, hidden=2048, seq_len=2048) == (
        6e9 + 12 * 24 * 2048 * 2048
    )


def test_mfu_and_step_time_round_trip():
    step = flops.step_time(flops_per_step=3.0e18, n_gpus=1024, peak_flops_per_gpu=312e12, mfu=0.45)
    assert step == pytest.approx(3.0e18 / (1024 * 312e12 * 0.45))
    assert flops.mfu(
        flops_per_step=3.0e18, step_time_s=step, n_gpus=1024, peak_flops_per_gpu=312e12
    ) == pytest.approx(0.45)


def test_narayanan_training_time():
    # Narayanan et al. 2021, Section 5.1: GPT-3 175B, 300B tokens, 1024 A100s at
    # 140 TFLOP/s each: about 34 days (8 T P / (n X), with recomputation).
    days = flops.training_time(175e9, 300e9, n_gpus=1024, flops_per_gpu=140e12) / 86400
    assert round(days) == 34
    assert flops.training_time(1, 1, n_gpus=1, flops_per_gpu=1, recompute=False) == 6


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: flops.training_flops_per_token(0), "n_params"),
        (lambda: flops.training_flops(1e9, -1), "tokens"),
        (
            lambda: flops.megatron_flops_per_step(
                batch=1, seq_len=1, layers=1, hidden=1, vocab=1, recompute="half"
            ),
            "recompute 'half'",
        ),
        (lambda: flops.step_time(flops_per_step=1, n_gpus=1, peak_flops_per_gpu=1, mfu=0), "mfu"),
        (lambda: flops.step_time(flops_per_step=1, n_gpus=1, peak_flops_per_gpu=1, mfu=1.5), "mfu"),
        (
            lambda: flops.mfu(flops_per_step=1, step_time_s=0, n_gpus=1, peak_flops_per_gpu=1),
            "step_time_s",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_elementwise_traffic_fused_and_unfused():
    # c = relu(a * b): unfused, a*b is written and read back (5 tensor passes in 2
    # kernels); fused, a and b are read and c written (3 passes in 1 kernel).
    n = 1 << 20
    unfused = flops.elementwise_traffic(n, [(2, 1), (1, 1)])
    fused = flops.elementwise_traffic(n, [(2, 1)])
    assert unfused.total == 5 * 4 * n and unfused.kernels == 2
    assert fused.total == 3 * 4 * n and fused.kernels == 1
    assert (unfused.read_bytes, unfused.written_bytes) == (3 * 4 * n, 2 * 4 * n)
    assert flops.elementwise_traffic(n, [(1, 1)], bytes_per_element=2).total == 4 * n


def test_roofline():
    # A100: 312 TFLOP/s over 2,039 GB/s, a ridge at about 153 FLOPs per byte.
    assert flops.ridge_point(peak_flops=312e12, bandwidth=2039e9) == pytest.approx(153.0, rel=1e-3)
    n = 1 << 24
    traffic = flops.elementwise_traffic(n, [(2, 1)]).total  # an fp32 add: 1 FLOP per 12 bytes
    assert flops.arithmetic_intensity(flops=n, n_bytes=traffic) == pytest.approx(1 / 12)
    memory_bound = flops.roofline_time(flops=n, n_bytes=traffic, peak_flops=312e12, bandwidth=2e12)
    assert memory_bound == traffic / 2e12
    # a square fp16 matmul of side 8192 is compute-bound: 2 m^3 FLOPs over 3 m^2 x 2 bytes
    m = 8192
    compute_bound = flops.roofline_time(
        flops=2 * m**3, n_bytes=6 * m * m, peak_flops=312e12, bandwidth=2e12
    )
    assert compute_bound == 2 * m**3 / 312e12
    assert flops.roofline_time(flops=0, n_bytes=8, peak_flops=1, bandwidth=4) == 2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: flops.elementwise_traffic(0, [(1, 1)]), "numel"),
        (lambda: flops.elementwise_traffic(8, []), "at least one"),
        (lambda: flops.elementwise_traffic(8, [(1, -1)]), r"\(1, -1\)"),
        (lambda: flops.elementwise_traffic(8, [(1, 1, 1)]), "pair"),
        (lambda: flops.arithmetic_intensity(flops=1, n_bytes=0), "n_bytes"),
        (lambda: flops.roofline_time(flops=-1, n_bytes=1, peak_flops=1, bandwidth=1), "flops"),
        (lambda: flops.ridge_point(peak_flops=1, bandwidth=0), "bandwidth"),
    ],
)
def test_traffic_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
