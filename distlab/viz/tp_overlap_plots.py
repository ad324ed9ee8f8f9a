"""Figures for the collective matmul: communication beside, or under, the matmul.

:func:`plot_overlap_timelines` draws the :class:`~distlab.parallel.tensor.overlap.Timeline`
of every rank for the serial version (all-gather, then multiply) above the overlapped
one (chunks passed round a ring while the previous chunk is multiplied): per rank, a
compute row and a communication row. Communication drawn under a compute bar is
hidden; what sticks out is exposed (:func:`~distlab.parallel.tensor.overlap.exposed_communication_seconds`,
printed in each panel's title). Both panels share the time axis, so the overlapped run
finishing earlier shows as a shorter row.

Returns a :class:`matplotlib.figure.Figure` (no pyplot state).
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from distlab.parallel.tensor.overlap import Timeline, exposed_communication_seconds

_COLORS = {"compute": "#4c72b0", "comm": "#c44e52"}
_MS = 1e3


def plot_overlap_timelines(
    serial: Sequence[Timeline],
    overlapped: Sequence[Timeline],
    *,
    names: tuple[str, str] = ("serial: all-gather, then matmul", "overlapped: ring of chunks"),
) -> Figure:
    """Two panels, one row pair per rank: each version's timelines in milliseconds from
    its own first interval. ``serial`` and ``overlapped`` are the per-rank timelines the
    two functions of :mod:`distlab.parallel.tensor.overlap` return (e.g. from
    ``distlab.run``)."""
    if not serial or not overlapped:
        raise ValueError("plot_overlap_timelines needs at least one timeline of each version")
    ranks = max(len(serial), len(overlapped))
    fig = Figure(figsize=(8, 1.2 + 1.1 * ranks), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, timelines, name in zip(axes, (serial, overlapped), names, strict=True):
        _draw(ax, timelines, name)
    axes[-1].set_xlabel("time since the first rank started (ms)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2,
               fontsize="small", frameon=False)  # fmt: skip
    return fig


def _draw(ax, timelines: Sequence[Timeline], name: str) -> None:
    origin = min(t.start for t in timelines)
    ticks, labels = [], []
    for row, timeline in enumerate(sorted(timelines, key=lambda t: t.rank)):
        base = 2 * (len(timelines) - 1 - row)
        for kind, offset in (("compute", 1), ("comm", 0)):
            spans = [((i.start - origin) * _MS, i.seconds * _MS) for i in timeline.of_kind(kind)]
            ax.broken_barh(
                spans,
                (base + offset + 0.1, 0.8),
                color=_COLORS[kind],
                edgecolor="white",
                alpha=0.9 if kind == "compute" else 0.7,
                label=kind if row == 0 else None,
            )
            ticks.append(base + offset + 0.5)
            labels.append(f"rank {timeline.rank} {kind}")
    ax.set_yticks(ticks, labels, fontsize="small")
    ax.set_ylim(0, 2 * len(timelines))
    exposed = [exposed_communication_seconds(t) * _MS for t in timelines]
    ax.set_title(
        f"{name}: exposed communication {min(exposed):.1f}-{max(exposed):.1f} ms per rank",
        fontsize="medium",
    )
