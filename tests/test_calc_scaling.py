"""Scaling laws and units."""

from __future__ import annotations

import pytest

from distlab.calc import scaling
from distlab.core import units


def test_amdahl_and_gustafson():
    assert scaling.amdahl_speedup(0.05, 8) == pytest.approx(5.926, rel=1e-3)
    assert scaling.amdahl_speedup(0.0, 64) == 64
    assert scaling.amdahl_speedup(0.1, 10**9) == pytest.approx(10, rel=1e-6)  # limit 1/f
    assert scaling.gustafson_speedup(0.05, 8) == pytest.approx(0.05 + 0.95 * 8)
    assert scaling.parallel_efficiency(scaling.amdahl_speedup(0.05, 8), 8) == pytest.approx(
        5.926 / 8, rel=1e-3
    )
    assert scaling.speedup(10.0, 2.5) == 4.0


def test_goyal_linear_scaling_and_warmup():
    # Goyal et al. 2017: lr 0.1 for 256 images -> 3.2 for a minibatch of 8192
    assert scaling.linear_scaling_lr(0.1, 256, 8192) == pytest.approx(3.2)
    kw = {"base_lr": 0.1, "target_lr": 3.2, "warmup_steps": 100}
    assert scaling.warmup_lr(0, **kw) == 0.1
    assert scaling.warmup_lr(50, **kw) == pytest.approx(1.65)
    assert scaling.warmup_lr(100, **kw) == scaling.warmup_lr(10**6, **kw) == 3.2


def test_effective_batch():
    assert scaling.effective_batch(16, 8, 8) == 1024
    assert scaling.effective_batch(4, 256) == 1024


def test_units():
    assert units.to_gb(31.40625e9) == pytest.approx(31.40625)
    assert units.to_gib(2**30) == 1
    assert units.format_bytes(31.40625e9) == "31.41 GB"
    assert units.format_bytes(2**31, "GiB") == "2.00 GiB"
    assert units.parse_bytes("80GB") == 80e9
    assert units.parse_bytes("1.5 GiB") == 1.5 * 2**30
    assert units.parse_bytes(4096) == 4096
    assert units.format_seconds(0.0451) == "45.1 ms"
    assert units.dtype_bytes("bf16") == 2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: scaling.amdahl_speedup(1.5, 8), "serial_fraction"),
        (lambda: scaling.amdahl_speedup(0.1, 0), "n must be"),
        (lambda: scaling.linear_scaling_lr(0.1, 0, 8), "base_batch"),
        (lambda: scaling.effective_batch(16, -1, 1), "dp must be"),
        (lambda: scaling.warmup_lr(-1, base_lr=0.1, target_lr=1, warmup_steps=5), "step"),
        (lambda: units.parse_bytes("80 GG"), "80 GG"),
        (lambda: units.parse_bytes("-3GB"), "-3GB"),
        (lambda: units.format_bytes(1, "gigs"), "gigs"),
        (lambda: units.dtype_bytes("fp12"), "fp12"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_straggler_probability():
    # Dean and Barroso 2013: 1 slow response in 100 per server, a request fanned out to
    # 100 servers is slow 63% of the time.
    assert scaling.straggler_probability(0.01, 100) == pytest.approx(0.634, abs=1e-3)
    assert scaling.straggler_probability(0.01, 1) == pytest.approx(0.01)
    assert scaling.straggler_probability(0.0, 10_000) == 0.0
    assert (
        scaling.straggler_probability(1e-4, 10_000) > 0.63 > scaling.straggler_probability(1e-4, 10)
    )
    with pytest.raises(ValueError, match="p_slow"):
        scaling.straggler_probability(1.5, 8)
