"""Pipeline Gantt charts: a schedule's replay and a measured run, drawn the same way.

Both inputs are :class:`~distlab.calc.pipeline_replay.Timeline` objects:
:func:`distlab.calc.pipeline.replay` (or :func:`distlab.sim.pipeline.simulate_pipeline`)
gives the planned one, :func:`distlab.parallel.pipeline.run_pipeline` the
measured one. One row per rank; forwards light, backwards dark (the split
backward's I mid-blue, W grey), each box labelled with its micro-batch;
white gaps are the bubble. Returns a :class:`matplotlib.figure.Figure`
(no pyplot state).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from distlab.calc.pipeline_replay import Timeline

_COLORS = {"F": (0.6, 0.75, 0.95), "B": (0.2, 0.35, 0.7), "I": (0.3, 0.5, 0.85), "W": (0.55,) * 3}


def draw_timeline(ax, timeline: Timeline, *, title: str = "", unit: str = "") -> None:
    """Draw ``timeline`` on ``ax``: one bar per compute action, deeper chunks darker."""
    t0 = min((e.start for e in timeline.entries), default=0.0)
    for e in timeline.entries:
        shade = 0.12 * e.action.chunk
        color = tuple(max(0.0, c - shade) for c in _COLORS[e.action.kind])
        ax.barh(
            e.rank, e.end - e.start, left=e.start - t0, color=color, edgecolor="white", height=0.8
        )
        ax.text(
            (e.start + e.end) / 2 - t0,
            e.rank,
            str(e.action.micro_batch),
            ha="center",
            va="center",
            fontsize=7,
            color="black" if e.action.kind == "F" else "white",
        )
    p = len(timeline.busy)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlabel(f"time{f' ({unit})' if unit else ''}")
    ax.set_title(f"{title}{': ' if title else ''}bubble {timeline.bubble_fraction:.1%} of the step")


def plot_timeline(timeline: Timeline, *, title: str = "", unit: str = "") -> Figure:
    """One Gantt chart."""
    p = len(timeline.busy)
    fig = Figure(figsize=(8, 0.6 * p + 1.2), layout="constrained")
    draw_timeline(fig.add_subplot(), timeline, title=title, unit=unit)
    return fig


def plot_planned_and_measured(planned: Timeline, measured: Timeline, *, unit: str = "s") -> Figure:
    """The schedule's replay (left) and the real run (right), side by side, same rows."""
    p = len(planned.busy)
    fig = Figure(figsize=(13, 0.6 * p + 1.4), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    name = planned.schedule.name
    draw_timeline(left, planned, title=f"{name}, replayed", unit=unit)
    draw_timeline(right, measured, title=f"{name}, measured", unit=unit)
    return fig
