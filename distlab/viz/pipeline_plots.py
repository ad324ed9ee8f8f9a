"""Pipeline Gantt charts: a schedule's replay and a measured run, drawn the same way.

Both inputs are :class:`~distlab.sim.pipeline_replay.Timeline` objects:
:func:`distlab.calc.pipeline.replay` (or :func:`distlab.sim.pipeline.simulate_pipeline`)
gives the planned one, :func:`distlab.parallel.pipeline.run_pipeline` the
measured one. One row per rank; the colour says the kind of action (forward
blue, backward green, the split backward's input gradient orange and weight
gradient grey), a legend beside the chart names them; white gaps are the
bubble. Each box is labelled with its micro-batch, written level, where the label
fits inside the box at the size the figure is drawn (a narrow box goes without,
its colour still says what it is). With several chunks per rank (interleaved,
ZB-V, DualPipe) the shade says the chunk: chunk 0 full, later chunks lighter, as in
the papers' figures, and the legend shows each kind's shades. Figures are
:class:`matplotlib.figure.Figure` objects (no pyplot state).
"""

from __future__ import annotations

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.patches import Patch
from matplotlib.text import Text

from distlab.sim.pipeline_replay import Timeline
from distlab.viz.style import NOTEBOOK_WIDTH_IN

#: kind -> (colour of chunk 0, colour of the last chunk, legend label); tab20's pairs
KINDS = {
    "F": ("#1f77b4", "#aec7e8", "F: forward"),
    "B": ("#2ca02c", "#98df8a", "B: backward"),
    "I": ("#ff7f0e", "#ffbb78", "I: input gradient"),
    "W": ("#7f7f7f", "#c7c7c7", "W: weight gradient"),
}
LABEL_PT = 8
ROW_IN = 0.5  # figure height per rank
PAD_PX = 2  # a label keeps this far from its box's sides


def shade(kind: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """The colour of ``kind`` on ``chunk`` of ``chunks``: from the kind's full colour
    (chunk 0) to its light one (the last chunk)."""
    full, light = (to_rgb(c) for c in KINDS[kind][:2])
    t = chunk / (chunks - 1) if chunks > 1 else 0.0
    return tuple(a + (b - a) * t for a, b in zip(full, light))


def _ink(rgb) -> str:
    """Black or white, whichever contrasts more with ``rgb`` (WCAG relative luminance)."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    lum = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


class BoxLabel(Text):
    """A label drawn only when it fits inside ``box`` at the size the figure is drawn."""

    def __init__(self, box: Patch, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.box = box

    def fits(self, renderer) -> bool:
        box, text = self.box.get_window_extent(renderer), self.get_window_extent(renderer)
        return text.width <= box.width - 2 * PAD_PX and text.height <= box.height

    def draw(self, renderer) -> None:
        if self.get_visible() and self.fits(renderer):
            super().draw(renderer)


def box_labels(ax) -> list[BoxLabel]:
    """The micro-batch labels :func:`draw_timeline` put on ``ax`` (drawn or not)."""
    return [t for t in ax.texts if isinstance(t, BoxLabel)]


def legend_handles(timeline: Timeline) -> list[Patch | tuple[Patch, ...]]:
    """One handle per kind of action the timeline holds: a patch, or with several chunks a
    row of patches, one per chunk (full to light)."""
    kinds = {e.action.kind for e in timeline.entries}
    v = timeline.schedule.chunks
    return [
        tuple(Patch(facecolor=shade(k, c, v), edgecolor="white", label=label) for c in range(v))
        if v > 1
        else Patch(facecolor=shade(k, 0, 1), edgecolor="white", label=label)
        for k, (_, _, label) in KINDS.items()
        if k in kinds
    ]


def draw_timeline(
    ax, timeline: Timeline, *, title: str = "", unit: str = "", legend: bool = True
) -> None:
    """Draw ``timeline`` on ``ax``: one bar per compute action, coloured by kind (and shaded
    by chunk), labelled with its micro-batch where that fits; a legend of kinds (and chunks)
    to the right unless ``legend=False``."""
    t0 = min((e.start for e in timeline.entries), default=0.0)
    v = timeline.schedule.chunks
    entries = timeline.entries
    colours = [shade(e.action.kind, e.action.chunk, v) for e in entries]
    bars = ax.barh(
        [e.rank for e in entries],
        [e.end - e.start for e in entries],
        left=[e.start - t0 for e in entries],
        color=colours,
        edgecolor="white",
        linewidth=0.8,
        height=0.8,
    )
    for bar, e, colour in zip(bars, entries, colours, strict=True):
        label = BoxLabel(
            bar,
            (e.start + e.end) / 2 - t0,
            e.rank,
            str(e.action.micro_batch),
            ha="center",
            va="center",
            fontsize=LABEL_PT,
            color=_ink(colour),
        )
        label.set_in_layout(False)  # inside its box: the layout need not measure it
        ax.add_artist(label)
    p = len(timeline.busy)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlabel(f"time{f' ({unit})' if unit else ''}")
    ax.set_title(f"{title}{': ' if title else ''}bubble {timeline.bubble_fraction:.1%} of the step")
    if legend:
        handles = legend_handles(timeline)
        ax.legend(
            handles=handles,
            labels=[h[0].get_label() if isinstance(h, tuple) else h.get_label() for h in handles],
            handler_map={tuple: HandlerTuple(ndivide=None, pad=0)},
            title=f"chunk {' | '.join(map(str, range(v)))}" if v > 1 else None,
            title_fontsize=8,
            alignment="left",
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            fontsize=8,
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
    fig = Figure(
        figsize=(NOTEBOOK_WIDTH_IN, ROW_IN * rows + 1.1 * len(timelines)), layout="constrained"
    )
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
