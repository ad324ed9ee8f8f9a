"""The simulator's figures draw what the library computes (plain Figures, no pyplot)."""

import pytest

from distlab.sim import crossover_size, preset
from distlab.sim.fit import Prediction
from distlab.sim.topology import NVLINK4
from distlab.viz.sim_plots import plot_predicted_vs_measured, plot_time_vs_size


def test_time_vs_size_marks_the_crossover():
    sizes = [2**k for k in range(10, 26)]
    fig = plot_time_vs_size(8, NVLINK4, sizes=sizes, method="closed_form")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    curves = [line for line in ax.get_lines() if len(line.get_xdata()) == len(sizes)]
    assert [c.get_label() for c in curves] == ["ring all reduce", "tree all reduce"]
    vertical = [line for line in ax.get_lines() if line not in curves]
    assert len(vertical) == 1
    assert vertical[0].get_xdata()[0] == pytest.approx(crossover_size(8, NVLINK4))


def test_replay_on_a_cluster_with_more_algorithms():
    algorithms = ("ring_all_reduce", "tree_all_reduce", "hierarchical_shard_all_reduce")
    fig = plot_time_vs_size(
        16, preset("dgx-h100", nodes=2), algorithms, sizes=[2**12, 2**20, 2**28]
    )
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "hierarchical shard all reduce" in labels


def test_predicted_vs_measured():
    points = [Prediction("all_reduce", "ring", 2, 4096, 1e-4, 1.2e-4)]
    fig = plot_predicted_vs_measured(points)
    assert fig.axes[0].get_xlabel() == "measured time (ms)"
    with pytest.raises(ValueError, match="no predictions"):
        plot_predicted_vs_measured([])
    with pytest.raises(ValueError, match="method must be"):
        plot_time_vs_size(4, NVLINK4, method="guess")
