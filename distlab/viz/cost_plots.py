"""Figures for the cost of collectives: link speeds, latency vs bandwidth terms, measured runs.

Each function returns a :class:`matplotlib.figure.Figure` (no pyplot state),
which a notebook displays when it is the cell's value. Every number drawn
comes from :mod:`distlab.sim` (presets and closed forms) or from the records
of :func:`distlab.commands.bench.run_bench`.

* :func:`plot_link_bandwidths` - every link of the cluster presets, per direction
  and both directions added (the two conventions data sheets mix);
* :func:`plot_cost_breakdown` - each algorithm's time split into its latency
  (``a alpha``) and bandwidth (``b N beta``) terms, for a few message sizes;
* :func:`plot_bench` - measured time per algorithm and size from bench records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from distlab.core.units import format_size
from distlab.sim.algorithms import closed_form
from distlab.sim.topology import PRESETS, ClusterSpec, Link
from distlab.viz.style import log_scale

GB = 1e9


def preset_links(presets: Mapping[str, ClusterSpec] | None = None) -> list[Link]:
    """The distinct links of ``presets`` (default: every preset), fastest first."""
    clusters = PRESETS if presets is None else presets
    links: dict[str, Link] = {}
    for cluster in clusters.values():
        for link in (cluster.intra, cluster.far_intra, cluster.inter):
            if link is not None:
                links.setdefault(link.name, link)
    return sorted(links.values(), key=lambda link: -link.bandwidth)


def plot_link_bandwidths(presets: Mapping[str, ClusterSpec] | None = None) -> Figure:
    """Horizontal bars: each link's bandwidth per direction (dark) and both
    directions added (light), in GB/s (1 GB = 1e9 bytes), with its latency alpha.

    Vendors quote NVLink with both directions added ("900 GB/s" for H100) and
    network cards per direction ("400 Gb/s"); one picture shows both.
    """
    links = preset_links(presets)
    if not links:
        raise ValueError("no links to plot: the presets are empty")
    fig = Figure(figsize=(7.5, 0.45 * len(links) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    rows = range(len(links))[::-1]
    one_way = [link.bandwidth / GB for link in links]
    ax.barh(rows, [2 * b for b in one_way], color="#a6c8e8", label="both directions added")
    ax.barh(rows, one_way, color="#2f6ea8", label="one direction")
    for row, link, b in zip(rows, links, one_way):
        ax.annotate(
            f" {b:g} GB/s one way ({2 * b:g} both), alpha {link.alpha * 1e6:g} us",
            (2 * b, row),
            va="center",
            fontsize=8,
        )
    ax.set_yticks(list(rows), [link.name for link in links], fontsize=8)
    log_scale(ax, "x")
    ax.set_xlim(min(one_way) / 4, max(one_way) * 30)  # every bar rises off the axis
    ax.set_xlabel("GB/s (log scale)")
    ax.set_title("Links in distlab's cluster presets")
    fig.legend(frameon=False, loc="outside lower center", ncols=2, fontsize=8)  # off the bars
    return fig


def _number(value: float) -> str:
    """A value printed on a bar: ``14,316``, ``28``, ``0.0159``."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def plot_cost_breakdown(
    n: int,
    link: Link,
    sizes: Sequence[int],
    algorithms: Sequence[str] = ("ring_all_reduce", "tree_all_reduce"),
) -> Figure:
    """One panel per message size: each algorithm's closed-form time
    (:func:`distlab.sim.closed_form`) as a stacked bar of its latency term
    ``a alpha`` and its bandwidth term ``b N beta`` on ``link``, both written above the
    bar (one of them is often too thin to see: that is the point of the picture)."""
    if not sizes:
        raise ValueError("sizes must name at least one message size in bytes")
    if not algorithms:
        raise ValueError("algorithms must name at least one algorithm")
    fig = Figure(figsize=(3.3 * len(sizes) + 0.5, 3.6), layout="constrained")
    axes = fig.subplots(1, len(sizes), squeeze=False)[0]
    for ax, size in zip(axes, sizes):
        for i, name in enumerate(algorithms):
            cost = closed_form(name, n)
            latency = cost.alpha_terms * link.alpha * 1e6
            bandwidth = cost.beta_factor * size * link.beta * 1e6
            ax.bar(i, latency, color="#dd8452", label="latency a·alpha" if i == 0 else None)
            ax.bar(
                i,
                bandwidth,
                bottom=latency,
                color="#4c72b0",
                label="bandwidth b·N·beta" if i == 0 else None,
            )
            ax.annotate(
                f"latency {_number(latency)}\nbandwidth {_number(bandwidth)}",
                (i, latency + bandwidth),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylim(top=ax.get_ylim()[1] * 1.3)  # room for the numbers
        short = [name.replace("_all_reduce", "").replace("_", " ") for name in algorithms]
        ax.set_xticks(range(len(algorithms)), short, rotation=20, fontsize=8)
        ax.set_title(f"N = {format_size(size)}", fontsize=10)
        ax.set_ylabel("time (us)")
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=2,
        frameon=False,
        fontsize=8,
    )
    fig.suptitle(f"All-reduce on {n} ranks, {link.name}", fontsize=10)
    return fig


def plot_bench(records: Sequence[Mapping]) -> Figure:
    """Grouped bars of measured time (log scale, each bar's milliseconds written above
    it): one group per message size, one bar per algorithm, from
    :func:`distlab.commands.bench.run_bench` records of one collective on one world size."""
    if not records:
        raise ValueError("no bench records to plot")
    kinds = {(r["collective"], r["world_size"]) for r in records}
    if len(kinds) != 1:
        raise ValueError(f"plot_bench draws one collective on one world size; got {sorted(kinds)}")
    ((collective, world_size),) = kinds
    sizes = sorted({r["bytes"] for r in records})
    algorithms = list(dict.fromkeys(r["algorithm"] for r in records))
    times = {(r["algorithm"], r["bytes"]): r["time_s"] for r in records}
    fig = Figure(figsize=(2.0 + 0.6 * len(sizes) * len(algorithms), 3.4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(algorithms)
    for j, algorithm in enumerate(algorithms):
        xs = [i + (j - (len(algorithms) - 1) / 2) * width for i in range(len(sizes))]
        ys = [times.get((algorithm, size), float("nan")) * 1e3 for size in sizes]
        bars = ax.bar(xs, ys, width=width, label=algorithm)
        ax.bar_label(bars, ["" if math.isnan(y) else _number(y) for y in ys], fontsize=8, padding=1)
    ax.set_xticks(range(len(sizes)), [format_size(s) for s in sizes])
    log_scale(ax, "y")
    shortest = min(r["time_s"] for r in records) * 1e3
    # the shortest bar rises a good way off the axis; room above the tallest for its number
    ax.set_ylim(shortest / 4, ax.get_ylim()[1] * 2)
    ax.set_ylabel("time per call (ms, log scale)")
    ax.set_title(f"measured {collective.replace('_', '-')} on {world_size} ranks")
    ax.legend(frameon=False, fontsize=8)
    return fig
