"""Notebook 11's scaling figures draw what distlab.calc.scaling computes (issue 27)."""

from __future__ import annotations

import math

import pytest

from distlab.calc import scaling
from distlab.viz import calc_plots


def _lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def test_amdahl_gustafson_plot_draws_the_laws_and_the_ceiling():
    fig = calc_plots.plot_amdahl_gustafson((0.02, 0.05), max_gpus=256)
    speed, eff = fig.axes
    lines = _lines(speed)
    amdahl = lines["Amdahl, s = 5%"]
    assert list(amdahl.get_xdata()) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert math.isclose(amdahl.get_ydata()[-1], scaling.amdahl_speedup(0.05, 256))  # 18.6x
    gustafson = lines["Gustafson, s = 2%"]
    assert math.isclose(gustafson.get_ydata()[-1], scaling.gustafson_speedup(0.02, 256))
    assert set(lines["Amdahl's ceiling 1/s = 50"].get_ydata()) == {50}
    efficiency = _lines(eff)["Amdahl, s = 2%"].get_ydata()[-1]
    assert math.isclose(
        efficiency, scaling.parallel_efficiency(scaling.amdahl_speedup(0.02, 256), 256)
    )
    legend = {t.get_text() for t in speed.get_legend().get_texts()}
    assert {"Amdahl, s = 2%", "Gustafson, s = 5%", "ideal: n"} <= legend


def test_straggler_plot_draws_one_line_per_probability():
    fig = calc_plots.plot_straggler_probability((1e-4, 1e-3), max_gpus=16_384)
    (ax,) = fig.axes
    lines = _lines(ax)
    assert set(lines) == {
        "each GPU slow in 0.01% of its steps",
        "each GPU slow in 0.10% of its steps",
    }
    rare = lines["each GPU slow in 0.10% of its steps"]
    assert rare.get_xdata()[-1] == 16_384
    assert math.isclose(rare.get_ydata()[-1], scaling.straggler_probability(1e-3, 16_384))


@pytest.mark.parametrize("bad", [1, 0, 2.5, True])
def test_scaling_plots_name_a_bad_gpu_count(bad):
    for plot in (calc_plots.plot_amdahl_gustafson, calc_plots.plot_straggler_probability):
        error = TypeError if isinstance(bad, bool) else ValueError  # core.checks.int_in's rule
        with pytest.raises(error, match=f"max_gpus must be an integer >= 2, got {bad!r}"):
            plot(max_gpus=bad)


def test_a_gpu_count_that_is_not_a_power_of_two_ends_the_axis():
    fig = calc_plots.plot_straggler_probability((1e-3,), max_gpus=1000)
    assert list(fig.axes[0].get_lines()[0].get_xdata())[-2:] == [512, 1000]
