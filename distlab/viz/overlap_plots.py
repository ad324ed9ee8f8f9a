"""Figures for DDP's overlap of gradient communication with backward.

:func:`plot_step_trace` draws one :class:`~distlab.parallel.data.step_trace.StepTrace`
as a timeline: a compute row (forward, then backward until its last
gradient) and a communication row with one bar per bucket's all-reduce, a
tick where each bucket's gradients became ready. Bars to the left of the
"backward ends" line are hidden behind compute; what sticks out to the right
is what the step pays for communication (Li et al. 2020, Figure 6).

Returns a :class:`matplotlib.figure.Figure` (no pyplot state), which a
notebook shows when it is the cell's value.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from distlab.parallel.data.step_trace import StepTrace

_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "comm": "#c44e52", "ready": "black"}


def plot_step_trace(trace: StepTrace, *, title: str | None = None, ax=None) -> Figure:
    """Timeline of one step in milliseconds: compute above, bucket all-reduces below."""
    t = trace.relative()
    if ax is None:
        fig = Figure(figsize=(8, 2.6), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    ms = 1e3
    ax.broken_barh(
        [(t.forward_start * ms, (t.forward_end - t.forward_start) * ms)],
        (1.1, 0.8),
        color=_COLORS["forward"],
        label="forward",
    )
    ax.broken_barh(
        [(t.forward_end * ms, (t.backward_end - t.forward_end) * ms)],
        (1.1, 0.8),
        color=_COLORS["backward"],
        label="backward",
    )
    for b in t.buckets:
        ax.broken_barh(
            [(b.start * ms, (b.end - b.start) * ms)],
            (0.1, 0.8),
            color=_COLORS["comm"],
            edgecolor="white",
            label="all-reduce (one bar per bucket)" if b.bucket == 0 else None,
        )
        ax.plot(
            [b.ready * ms] * 2,
            [0.0, 1.0],
            color=_COLORS["ready"],
            lw=0.8,
            label="bucket ready" if b.bucket == 0 else None,
        )
    ax.axvline(t.backward_end * ms, color="gray", ls="--", lw=1, label="backward ends")
    ax.set_yticks([0.5, 1.5], ["communication", "compute"])
    ax.set_xlabel("time since the step started (ms)")
    hidden = t.overlapped_seconds / t.comm_seconds if t.comm_seconds else 0.0
    ax.set_title(
        title
        or f"{len(t.buckets)} buckets: {hidden:.0%} of all-reduce time overlaps "
        f"backward; {t.exposed_seconds * ms:.1f} ms exposed after it"
    )
    ax.legend(loc="upper left", fontsize="small", ncols=3, frameon=False, bbox_to_anchor=(0, -0.35))
    ax.set_ylim(0, 2.1)
    return fig


def plot_step_times(rows: Sequence[tuple[str, float]], *, title: str = "DDP step time") -> Figure:
    """Bars of step time (seconds) per variant, e.g. naive vs bucketed vs overlapped."""
    fig = Figure(figsize=(5, 2.8), layout="constrained")
    ax = fig.add_subplot()
    names = [name for name, _ in rows]
    values = [seconds * 1e3 for _, seconds in rows]
    ax.barh(names, values, color=_COLORS["comm"])
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:.1f} ms", va="center", fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("median step time (ms)")
    ax.set_title(title)
    return fig
