"""Figures for placement and scheduling: the cluster grid coloured by group, costs, timelines.

Each function returns a :class:`matplotlib.figure.Figure` (no pyplot state),
which a notebook displays when it is the cell's value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from distlab.placement.placer import Placement
from distlab.placement.scheduler import ScheduleResult
from distlab.placement.score import CommScore
from distlab.placement.stats import ScheduleStats, timeline_arrays
from distlab.viz.style import NOTEBOOK_WIDTH_IN

_DIM_TITLES = {
    "tp": "tensor (TP)",
    "pp": "pipeline (PP)",
    "dp": "data (DP)",
    "cp": "context (CP)",
    "ep": "expert (EP)",
}


def plot_placement(
    placement: Placement, color_by: Sequence[str] = ("tp", "pp", "dp"), *, max_nodes: int = 16
) -> Figure:
    """The nodes used (rows) x their GPUs (columns), one panel per dimension in ``color_by``.

    A cell's colour is the group its rank belongs to in that dimension, its label
    the rank; grey cells are GPUs the job does not use. Only the first ``max_nodes``
    nodes the job uses are drawn.
    """
    g = placement.cluster.gpus_per_node
    nodes = placement.nodes_used()[:max_nodes]
    row_of = {node: i for i, node in enumerate(nodes)}
    width = min(NOTEBOOK_WIDTH_IN, 3.2 * len(color_by) + 0.5)
    fig = Figure(figsize=(width, 0.45 * len(nodes) + 1.4), layout="constrained")
    axes = fig.subplots(1, len(color_by), squeeze=False)[0]
    for ax, dim in zip(axes, color_by, strict=True):
        key = "dp-cp" if dim == "dp" and placement.layout.cp > 1 else dim
        groups = placement.gpu_groups(key)
        colour = np.full((len(nodes), g), np.nan)
        label = np.full((len(nodes), g), -1)
        for gi, row in enumerate(groups):
            for gpu in row.tolist():
                node, local = divmod(gpu, g)
                if node in row_of:
                    colour[row_of[node], local] = gi % 20
        for rank, gpu in enumerate(placement.gpu_of_rank.tolist()):
            node, local = divmod(gpu, g)
            if node in row_of:
                label[row_of[node], local] = rank
        cmap = colormaps["tab20"].with_extremes(bad="#dddddd")
        ax.imshow(np.ma.masked_invalid(colour), cmap=cmap, vmin=0, vmax=19, aspect="auto")
        for (r, c), rank in np.ndenumerate(label):
            if rank >= 0 and g <= 16:
                ax.text(c, r, str(rank), ha="center", va="center", fontsize=7)
        ax.set_title(f"{_DIM_TITLES.get(dim, dim)}: {len(groups)} groups of {groups.shape[1]}")
        ax.set_xticks(range(g))
        ax.set_yticks(range(len(nodes)), [f"node {n}" for n in nodes])
        ax.set_xlabel("GPU in node")
    fig.suptitle(
        f"{placement.layout.label()} on {placement.cluster.name} (order {placement.order})"
    )
    return fig


def plot_comm_comparison(rows: Sequence[tuple[str, Placement, CommScore]]) -> Figure:
    """Stacked bars of communication ms per step by dimension, one bar per placement
    (the output of :func:`~distlab.placement.compare_placements`)."""
    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.subplots()
    dims = sorted(
        {p.dimension for _, _, s in rows for p in s.parts}, key=["tp", "cp", "ep", "pp", "dp"].index
    )
    bottom = np.zeros(len(rows))
    for i, dim in enumerate(dims):
        ms = np.array([score.breakdown().get(dim, 0.0) * 1e3 for _, _, score in rows])
        ax.bar([label for label, _, _ in rows], ms, bottom=bottom, label=dim.upper(), color=f"C{i}")
        bottom += ms
    ax.set_ylabel("communication per step (ms)")
    ax.legend()
    return fig


def plot_schedule(result: ScheduleResult) -> Figure:
    """Utilisation and queue length over time (top), fragmentation over time (bottom).

    Each panel's legend sits above it, outside the data. In the bottom panel the
    free GPUs on partly used nodes are a shaded area and the stranded ones (which
    fit no waiting TP group) a line over it, so neither hides the other.
    """
    a = timeline_arrays(result.timeline)
    hours = (a["time_s"] - a["time_s"][0]) / 3600
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    world = result.cluster.world_size
    top.step(hours, a["busy"] / world, where="post", color="C0", label="busy GPUs / all")
    top.step(hours, a["up"] / world, where="post", color="C2", ls="--", label="healthy GPUs / all")
    top.set_ylim(0, 1.05)
    top.set_ylabel("fraction of GPUs")
    queue = top.twinx()
    queue.step(hours, a["waiting"], where="post", color="C3", alpha=0.6, label="jobs waiting")
    queue.set_ylabel("jobs waiting (right axis)", color="C3")
    queue.set_ylim(0, max(1.0, float(np.max(a["waiting"], initial=0))) * 1.05)
    handles = top.get_legend_handles_labels()[0] + queue.get_legend_handles_labels()[0]
    top.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncols=3, frameon=False)
    fig.suptitle(f"{result.policy} on {result.cluster.name} ({world} GPUs)")
    bottom.fill_between(
        hours,
        a["partial"],
        step="post",
        color="C1",
        alpha=0.35,
        lw=0,
        label="free GPUs on partly used nodes",
    )
    bottom.step(
        hours,
        a["stranded"],
        where="post",
        color="C4",
        lw=1.2,
        label="free GPUs that fit no waiting TP group",
    )
    bottom.set_ylim(0, 1.05)
    bottom.set_xlabel("time (h)")
    bottom.set_ylabel("fraction of free GPUs")
    bottom.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=2, frameon=False)
    return fig


def _wait_label(wait) -> str:
    if wait is None:
        return "none"  # the run started no job of this priority
    minutes = wait.mean_s / 60
    return "no wait" if minutes == 0 else f"{minutes:.0f}" if minutes >= 10 else f"{minutes:.1f}"


def plot_waits(stats: Sequence[ScheduleStats]) -> Figure:
    """Mean wait per priority, one group of bars per run (e.g. first-fit vs best-fit).

    Each bar's minutes are written above it, so a priority whose jobs never waited reads
    "no wait" rather than leaving an empty gap, and one a run started no job of reads "none".
    """
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.subplots()
    priorities = sorted({p for s in stats for p in s.wait_by_priority})
    width = 0.8 / max(len(stats), 1)
    for i, s in enumerate(stats):
        waits = [s.wait_by_priority.get(p) for p in priorities]
        minutes = [w.mean_s / 60 if w is not None else 0 for w in waits]
        bars = ax.bar(np.arange(len(priorities)) + i * width, minutes, width, label=s.policy)
        ax.bar_label(bars, [_wait_label(w) for w in waits], fontsize=8, padding=1)
    ax.set_xticks(
        np.arange(len(priorities)) + width * (len(stats) - 1) / 2,
        [f"priority {p}" for p in priorities],
    )
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the numbers
    ax.set_ylabel("mean wait (min)")
    ax.set_title("Mean wait per priority (minutes on each bar)")
    ax.legend()
    return fig
