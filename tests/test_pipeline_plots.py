"""Pipeline Gantt charts: every colour is named in a legend, chunks differ by hatch and label,
and a replay and a measured run share one time axis."""

import pytest
from matplotlib.figure import Figure

from distlab.parallel.pipeline import interleaved, one_f_one_b, replay, zb_h1
from distlab.viz.pipeline_plots import (
    draw_timeline,
    plot_planned_and_measured,
    plot_timeline,
    plot_timelines,
)


def _legend_labels(ax) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None, (
        "a Gantt chart encodes the kind of action by colour: it needs a legend"
    )
    return [t.get_text() for t in legend.get_texts()]


def test_each_kind_of_action_is_named_in_the_legend():
    plain = plot_timeline(replay(one_f_one_b(3, 4))).axes[0]
    assert _legend_labels(plain) == ["F: forward", "B: backward"]
    split = plot_timeline(replay(zb_h1(3, 4), weight_fraction=0.5)).axes[0]
    assert _legend_labels(split) == ["F: forward", "I: input gradient", "W: weight gradient"]
    colours = {p.get_facecolor() for p in split.patches}
    assert len(colours) == 3, "F, I and W each need their own colour"


def test_interleaved_chunks_differ_by_hatch_and_label():
    timeline = replay(interleaved(2, 4, 2))
    ax = plot_timeline(timeline).axes[0]
    assert _legend_labels(ax)[-2:] == ["chunk 0", "chunk 1"]
    hatch_of_chunk = {}
    for entry, patch in zip(timeline.entries, ax.patches, strict=True):
        hatch_of_chunk.setdefault(entry.action.chunk, set()).add(patch.get_hatch() or "")
    assert all(len(h) == 1 for h in hatch_of_chunk.values()), hatch_of_chunk
    assert hatch_of_chunk[0] != hatch_of_chunk[1]
    labels = {t.get_text() for t in ax.texts}
    assert {"0F0", "1F0", "1B3"} <= labels, sorted(labels)
    # one chunk per rank: the label stays the micro-batch alone
    assert {t.get_text() for t in plot_timeline(replay(one_f_one_b(2, 3))).axes[0].texts} == {
        "0",
        "1",
        "2",
    }


def test_replayed_and_measured_share_the_time_axis():
    planned = replay(one_f_one_b(3, 4), forward_time=1.0, backward_time=2.0)
    slower = replay(one_f_one_b(3, 4), forward_time=1.5, backward_time=3.0)
    top, bottom = plot_planned_and_measured(planned, slower).axes
    assert top.get_shared_x_axes().joined(top, bottom)
    assert top.get_xlim() == bottom.get_xlim()
    assert top.get_xlim()[1] >= slower.makespan - 1e-9  # the longer run fits both panels
    assert "replayed" in top.get_title() and "measured" in bottom.get_title()
    assert _legend_labels(top) and _legend_labels(bottom)


def test_stacked_charts_and_bad_input():
    a, b = replay(one_f_one_b(2, 2)), replay(zb_h1(2, 2))
    fig = plot_timelines(a, b)
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["1f1b", "zb_h1"]
    with pytest.raises(ValueError, match="titles"):
        plot_timelines(a, b, titles=["one"])
    with pytest.raises(ValueError, match="at least one"):
        plot_timelines()
    ax = Figure().subplots()
    draw_timeline(ax, a, legend=False)
    assert ax.get_legend() is None
