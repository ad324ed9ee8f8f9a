"""Placement figures draw what they claim, and the place/schedule commands run end to end."""

import json

import numpy as np

from distlab.cli import main
from distlab.core.layout import Layout
from distlab.placement import compare_placements, place
from distlab.placement.jobs import mixed_jobs
from distlab.placement.scheduler import simulate
from distlab.sim.topology import preset
from distlab.viz.placement_plots import (
    plot_comm_comparison,
    plot_placement,
    plot_schedule,
    plot_waits,
)


def test_placement_grid_colours_each_tp_group_alike():
    p = place(Layout(tp=4, pp=2, dp=2), preset("dgx-h100", nodes=2))
    fig = plot_placement(p, color_by=("tp",))
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (2, 8)
    # node 0 holds two TP groups of 4: GPUs 0-3 share a colour, 4-7 another
    assert len(set(image[0, :4].tolist())) == 1 and image[0, 0] != image[0, 4]
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert labels == {str(r) for r in range(16)}


def test_unused_gpus_are_masked():
    p = place(Layout(tp=2, dp=3), preset("dgx-h100", nodes=1))
    image = plot_placement(p, color_by=("dp",)).axes[0].images[0].get_array()
    assert np.ma.getmaskarray(image)[0, 6:].all() and not np.ma.getmaskarray(image)[0, :6].any()


def test_comparison_and_schedule_figures():
    rows = compare_placements(Layout(tp=8, dp=2), preset("dgx-h100", nodes=2))
    fig = plot_comm_comparison(rows)
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert max(heights) > 5 * min(h for h in heights if h > 0)
    cluster = preset("dgx-h100", nodes=8)
    jobs = mixed_jobs(40, cluster_gpus=cluster.world_size, seed=0)
    results = [simulate(jobs, cluster, policy=p) for p in ("first-fit", "best-fit")]
    assert len(plot_schedule(results[1]).axes) == 3
    assert len(plot_waits([r.stats() for r in results]).axes[0].patches) >= 2


def test_place_command_prints_json(capsys):
    assert main(["place", "--nodes", "2", "--tp", "8", "--dp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["violations"] == [] and len(out["ranks"]) == 16
    assert out["ranks"][8] == {"rank": 8, "node": 1, "gpu": 0}
    fixed = ["place", "--nodes", "2", "--tp", "2", "--pp", "2", "--dp", "4", "--json"]
    assert main([*fixed, "--order", "tp-cp-ep-pp-dp"]) == 0
    assert json.loads(capsys.readouterr().out)["order"] == "tp-cp-ep-pp-dp"  # kept, not chosen


def test_schedule_command_and_bad_input(capsys):
    assert main(["schedule", "--nodes", "4", "--jobs", "30", "--policy", "best-fit", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats[0]["policy"] == "best-fit" and stats[0]["jobs"] == 30
    assert main(["place", "--tp", "16"]) == 2
    assert "tp=16 is larger" in capsys.readouterr().err


def test_schedule_figure_names_every_line_and_keeps_legends_off_the_data():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    cluster = preset("dgx-h100", nodes=4)
    result = simulate(mixed_jobs(30, cluster_gpus=cluster.world_size, seed=1), cluster)
    fig = plot_schedule(result)
    top, bottom = fig.axes[0], fig.axes[1]
    top_labels = [t.get_text() for t in top.get_legend().get_texts()]
    assert top_labels == ["busy GPUs / all", "healthy GPUs / all", "jobs waiting"]
    bottom_labels = [t.get_text() for t in bottom.get_legend().get_texts()]
    assert sorted(bottom_labels) == [
        "free GPUs on partly used nodes",
        "free GPUs that fit no waiting TP group",
    ]
    # the two fragmentation series are drawn differently (an area and a line), not two lines
    assert len(bottom.lines) == 1 and len(bottom.collections) == 1
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    for ax in (top, bottom):
        legend_box = ax.get_legend().get_window_extent(renderer)
        assert legend_box.y0 >= ax.get_window_extent(renderer).y1 - 1, "the legend covers data"
