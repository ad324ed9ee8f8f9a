"""Figures for the collective simulator: time vs message size, predicted vs measured.

Each function returns a :class:`matplotlib.figure.Figure` (no pyplot state),
which a notebook displays when it is the cell's value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from distlab.core.units import format_size
from distlab.sim.algorithms import build_schedule, closed_form
from distlab.sim.crossover import crossover_size
from distlab.sim.fit import Prediction
from distlab.sim.replay import Topology, as_cluster, simulate
from distlab.sim.topology import Link
from distlab.viz.style import log_scale

DEFAULT_SIZES = tuple(2**k for k in range(10, 31))  # 1 KiB .. 1 GiB


def plot_time_vs_size(
    n: int,
    topology: Topology,
    algorithms: Sequence[str] = ("ring_all_reduce", "tree_all_reduce"),
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    method: str = "replay",
    crossover: tuple[str, str] | None = ("tree_all_reduce", "ring_all_reduce"),
) -> Figure:
    """Time of each algorithm vs message size on ``n`` ranks, log-log.

    ``method="replay"`` replays the schedules on ``topology`` (a
    :class:`ClusterSpec`, preset name or :class:`Link`); ``"closed_form"`` uses
    the formulas of :mod:`distlab.sim.cost` (needs a :class:`Link`).
    ``crossover=(small, large)`` marks the size below which ``small`` wins,
    when both are plotted.
    """
    if method not in ("replay", "closed_form"):
        raise ValueError(f"method must be 'replay' or 'closed_form', got {method!r}")
    if method == "closed_form" and not isinstance(topology, Link):
        raise TypeError("method='closed_form' needs a Link")
    cluster = as_cluster(topology, n)
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for name in algorithms:
        if method == "replay":
            schedule = build_schedule(name, n, ranks_per_node=cluster.gpus_per_node)
            times = [simulate(schedule, cluster, size).time_s for size in sizes]
        else:
            cost = closed_form(name, n)
            times = [cost.time(size, topology) for size in sizes]
        ax.plot(sizes, times, marker="o", markersize=3, label=name.replace("_", " "))
    if crossover and all(name in algorithms for name in crossover):
        small, large = crossover
        at = crossover_size(n, topology, small=small, large=large, method=method)
        if 0 < at < math.inf:
            ax.axvline(at, color="grey", linestyle="--", linewidth=1)
            ax.annotate(
                f"crossover\n{format_size(at)}",
                xy=(at, 0.5),
                xycoords=("data", "axes fraction"),
                xytext=(6, 0),
                textcoords="offset points",
                color="grey",
            )
    log_scale(ax, "x", base=2)
    log_scale(ax, "y")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(x)))
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("time (s)")
    where = topology.name if isinstance(topology, Link) else cluster.name
    ax.set_title(f"{n} ranks on {where} ({method.replace('_', ' ')})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    return fig


def plot_predicted_vs_measured(predictions: Sequence[Prediction]) -> Figure:
    """Measured vs predicted time per record in milliseconds (as bench tables print them),
    log-log, one colour per algorithm; points on the diagonal are predicted exactly."""
    if not predictions:
        raise ValueError("no predictions to plot")
    fig = Figure(figsize=(5.5, 5), layout="constrained")
    ax = fig.add_subplot()
    ms = 1e3
    for algorithm in dict.fromkeys(p.algorithm for p in predictions):
        mine = [p for p in predictions if p.algorithm == algorithm]
        ax.scatter(
            [p.measured_s * ms for p in mine],
            [p.predicted_s * ms for p in mine],
            s=14,
            label=algorithm,
        )
    lo = min(min(p.measured_s, p.predicted_s) for p in predictions) * ms
    hi = max(max(p.measured_s, p.predicted_s) for p in predictions) * ms
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    log_scale(ax)
    ax.set_xlabel("measured time (ms)")
    ax.set_ylabel("predicted time (ms)")
    ax.set_title("alpha-beta model vs measured runs")
    ax.legend()
    return fig
