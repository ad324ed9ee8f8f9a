"""Pipeline Gantt charts: a schedule's replay and a measured run, drawn the same way.

Both inputs are :class:`~distlab.sim.pipeline_replay.Timeline` objects:
:func:`distlab.calc.pipeline.replay` (or :func:`distlab.sim.pipeline.simulate_pipeline`)
gives the planned one, :func:`distlab.parallel.pipeline.run_pipeline` the
measured one. One row per rank; the colour says the kind of action (forward
light blue, backward dark blue, the split backward's input gradient orange and
weight gradient grey), a legend beside the chart names them; white gaps are the
bubble. Each box is labelled with its micro-batch; with several chunks per rank
(interleaved) the label, written upright, is the action itself (``1F3``: chunk 1,
forward, micro-batch 3) and each chunk after the first has its own hatch, listed in the
legend. Figures are :class:`matplotlib.figure.Figure` objects (no pyplot state).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from distlab.sim.pipeline_replay import Timeline

KINDS = {
    "F": ((0.62, 0.77, 0.96), "F: forward"),
    "B": ((0.16, 0.3, 0.62), "B: backward"),
    "I": ((0.93, 0.55, 0.2), "I: input gradient"),
    "W": ((0.55, 0.55, 0.55), "W: weight gradient"),
}
CHUNK_HATCHES = ("", "///", "...", "xxx", "\\\\\\", "ooo")


def _hatch(chunk: int) -> str:
    return CHUNK_HATCHES[chunk % len(CHUNK_HATCHES)]


def legend_handles(timeline: Timeline) -> list[Patch]:
    """One patch per kind of action the timeline holds, then one per chunk if it has several."""
    kinds = {e.action.kind for e in timeline.entries}
    handles = [
        Patch(facecolor=c, edgecolor="white", label=t) for k, (c, t) in KINDS.items() if k in kinds
    ]
    if timeline.schedule.chunks > 1:
        handles += [
            Patch(facecolor="white", edgecolor="0.3", hatch=_hatch(c), label=f"chunk {c}")
            for c in range(timeline.schedule.chunks)
        ]
    return handles


def draw_timeline(
    ax, timeline: Timeline, *, title: str = "", unit: str = "", legend: bool = True
) -> None:
    """Draw ``timeline`` on ``ax``: one bar per compute action, coloured by kind,
    hatched by chunk; a legend of kinds (and chunks) to the right unless ``legend=False``."""
    t0 = min((e.start for e in timeline.entries), default=0.0)
    several = timeline.schedule.chunks > 1
    entries = timeline.entries
    kinds = [e.action.kind for e in entries]
    bars = ax.barh(
        [e.rank for e in entries],
        [e.end - e.start for e in entries],
        left=[e.start - t0 for e in entries],
        color=[KINDS[k][0] for k in kinds],
        edgecolor="white",
        hatch=[_hatch(e.action.chunk) for e in entries],
        height=0.8,
    )
    for bar, kind in zip(bars, kinds, strict=True):
        bar.set_hatchcolor("0.15" if kind == "F" else "0.9")
    for e, kind in zip(entries, kinds, strict=True):
        label = ax.text(
            (e.start + e.end) / 2 - t0,
            e.rank,
            str(e.action) if several else str(e.action.micro_batch),
            ha="center",
            va="center",
            fontsize=6 if several else 7,
            rotation=90 if several else 0,
            color="black" if kind == "F" else "white",
            bbox={"boxstyle": "square,pad=0.1", "fc": KINDS[kind][0], "ec": "none"}
            if several
            else None,
        )
        label.set_in_layout(False)  # inside its box: the layout need not measure it
    p = len(timeline.busy)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlabel(f"time{f' ({unit})' if unit else ''}")
    ax.set_title(f"{title}{': ' if title else ''}bubble {timeline.bubble_fraction:.1%} of the step")
    if legend:
        ax.legend(
            handles=legend_handles(timeline),
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            fontsize=7,
            frameon=False,
        )


def plot_timeline(timeline: Timeline, *, title: str = "", unit: str = "") -> Figure:
    """One Gantt chart."""
    return plot_timelines(timeline, titles=[title], unit=unit)


def plot_timelines(
    *timelines: Timeline, titles: list[str] | None = None, unit: str = "", sharex: bool = False
) -> Figure:
    """Gantt charts stacked one above the other (titles default to the schedules' names);
    ``sharex=True`` puts them on one time axis, for timelines in the same unit."""
    if not timelines:
        raise ValueError("plot_timelines needs at least one Timeline, got none")
    titles = list(titles) if titles is not None else [t.schedule.name for t in timelines]
    if len(titles) != len(timelines):
        raise ValueError(f"{len(timelines)} timelines but {len(titles)} titles: {titles!r}")
    rows = sum(len(t.busy) for t in timelines)
    fig = Figure(figsize=(10, 0.45 * rows + 1.1 * len(timelines)), layout="constrained")
    axes = fig.subplots(len(timelines), 1, squeeze=False, sharex=sharex)[:, 0]
    for ax, timeline, title in zip(axes, timelines, titles, strict=True):
        draw_timeline(ax, timeline, title=title, unit=unit)
    if sharex:  # one time axis: label it once, under the last chart
        for ax in axes[:-1]:
            ax.set_xlabel("")
    return fig


def plot_planned_and_measured(planned: Timeline, measured: Timeline, *, unit: str = "s") -> Figure:
    """The schedule's replay (top) and the real run (bottom) on one time axis, so the
    measured run's extra length and idle time show as a longer bottom row."""
    name = planned.schedule.name
    return plot_timelines(
        planned, measured, titles=[f"{name}, replayed", f"{name}, measured"], unit=unit, sharex=True
    )
