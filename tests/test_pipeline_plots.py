"""Pipeline Gantt charts: every colour is named in a legend, chunks differ by shade, labels fit,
and a replay and a measured run share one time axis."""

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from distlab.parallel.pipeline import interleaved, one_f_one_b, replay, zb_h1
from distlab.viz.pipeline_plots import (
    box_labels,
    draw_timeline,
    legend_handles,
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


def test_interleaved_chunks_differ_by_shade_and_boxes_are_labelled_level():
    timeline = replay(interleaved(2, 4, 2))
    ax = plot_timeline(timeline).axes[0]
    assert ax.get_legend().get_title().get_text() == "chunk 0 | 1"
    assert _legend_labels(ax) == ["F: forward", "B: backward"]
    handles = legend_handles(timeline)
    assert all(len(h) == 2 for h in handles), "each kind shows its shade for chunk 0 and 1"
    colour_of = {}
    for entry, patch in zip(timeline.entries, ax.patches, strict=True):
        colour_of.setdefault((entry.action.kind, entry.action.chunk), set()).add(
            patch.get_facecolor()
        )
    assert all(len(c) == 1 for c in colour_of.values()), colour_of
    assert colour_of["F", 0] != colour_of["F", 1] and colour_of["F", 0] != colour_of["B", 0]
    labels = box_labels(ax)
    assert [t.get_text() for t in labels] == [str(e.action.micro_batch) for e in timeline.entries]
    assert {t.get_rotation() for t in labels} == {0.0}
    # one chunk per rank: the label is the micro-batch too
    assert {t.get_text() for t in box_labels(plot_timeline(replay(one_f_one_b(2, 3))).axes[0])} == {
        "0",
        "1",
        "2",
    }


def test_a_label_is_drawn_only_where_it_fits_in_its_box():
    timeline = replay(interleaved(4, 8, 2), forward_time=1, backward_time=2)
    narrow = Figure(figsize=(3, 2))
    draw_timeline(narrow.subplots(), timeline, legend=False)
    fitting = {}
    for name, fig in (("wide", plot_timeline(timeline)), ("narrow", narrow)):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        fitting[name] = sum(label.fits(renderer) for label in box_labels(fig.axes[0]))
    assert fitting["wide"] == len(timeline.entries), "at 10 inches every micro-batch is written"
    assert fitting["narrow"] < len(timeline.entries) / 2


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
