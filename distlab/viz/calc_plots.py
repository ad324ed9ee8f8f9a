"""Figures for the calculators: memory per ZeRO stage, pipeline bubbles, schedule Gantt charts,
Amdahl's and Gustafson's speed-ups, and the chance of a straggler.

Each function returns a :class:`matplotlib.figure.Figure` (no pyplot state),
which a notebook displays when it is the cell's value. Every number drawn
comes from :mod:`distlab.calc`.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from distlab.calc import memory, pipeline, scaling
from distlab.core.checks import int_in
from distlab.core.units import BYTE_UNITS
from distlab.viz.pipeline_plots import ROW_IN, draw_timeline
from distlab.viz.style import NOTEBOOK_WIDTH_IN, log_scale

_STATE_COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_states": "#55a868"}


def plot_memory_by_zero_stage(
    n_params: float,
    *,
    recipe: str = "mixed_adam",
    dp: int = 8,
    tp: int = 1,
    pp: int = 1,
    unit: str = "GB",
) -> Figure:
    """Stacked bars of parameter, gradient and optimizer-state bytes per GPU
    for ZeRO stages 0-3 (:func:`distlab.calc.memory.model_state_bytes`),
    each bar labelled with its total in ``unit`` (GB = 1e9 bytes, GiB = 2^30)."""
    if unit not in BYTE_UNITS:
        raise ValueError(f"unknown unit {unit!r}; allowed: {list(BYTE_UNITS)}")
    scale = BYTE_UNITS[unit]
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for stage in memory.ZERO_STAGES:
        states = memory.model_state_bytes(
            n_params, recipe=recipe, zero_stage=stage, dp=dp, tp=tp, pp=pp
        )
        bottom = 0.0
        for part, color in _STATE_COLORS.items():
            height = getattr(states, part) / scale
            ax.bar(stage, height, bottom=bottom, color=color, width=0.6)
            bottom += height
        ax.annotate(f"{bottom:.3g}", (stage, bottom), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(memory.ZERO_STAGES), ["0\nDDP", "1\nP_os", "2\nP_os+g", "3\nP_os+g+p"])
    ax.set_xlabel("ZeRO stage")
    ax.set_ylabel(f"{unit} per GPU")
    ax.set_title(f"Model states, {n_params:.3g} parameters, {recipe}, dp={dp}")
    ax.legend(
        handles=[Patch(color=c, label=k.replace("_", " ")) for k, c in _STATE_COLORS.items()],
        frameon=False,
    )
    return fig


def plot_bubble_vs_micro_batches(
    stages: int,
    *,
    max_micro_batches: int = 32,
    virtual_stages: Sequence[int] = (2, 4),
    relative_to: str = "total",
    check_points: Sequence[int] = (),
) -> Figure:
    """Bubble fraction against the number of micro-batches m, one line per schedule.

    GPipe and 1F1B share one curve, (p-1)/(m+p-1) of the step (or (p-1)/m of the
    ideal time with ``relative_to="ideal"``); each interleaved schedule with v
    chunks is drawn where m is a multiple of p. ``check_points``: values of m
    at which the bubble counted by replaying the schedules
    (:func:`distlab.calc.pipeline.replay`) is drawn as dots on the curves.
    """
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ms = list(range(1, max_micro_batches + 1))
    curves = [("gpipe", 1, "GPipe / 1F1B")] + [
        ("interleaved", v, f"interleaved, v={v}") for v in virtual_stages
    ]
    for schedule, v, label in curves:
        xs = [m for m in ms if schedule != "interleaved" or m % stages == 0]
        ys = [
            pipeline.bubble_fraction(
                stages, m, schedule=schedule, virtual_stages=v, relative_to=relative_to
            )
            for m in xs
        ]
        (line,) = ax.plot(xs, ys, marker="." if schedule == "interleaved" else None, label=label)
        if relative_to != "total":
            continue
        for m in check_points:
            if schedule == "interleaved" and m % stages:
                continue
            plan = pipeline.schedule_ops(stages, m, schedule=schedule, virtual_stages=v)
            counted = pipeline.replay(plan).bubble_fraction
            ax.plot([m], [counted], "o", color=line.get_color(), markerfacecolor="none")
    ax.set_xlabel("micro-batches per step, m")
    ax.set_ylabel("bubble / step time" if relative_to == "total" else "bubble / ideal time")
    ax.set_title(f"Pipeline bubble with p = {stages} stages")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    return fig


def plot_pipeline_schedule(
    stages: int,
    micro_batches: int,
    *,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    forward_time: float = 1.0,
    backward_time: float = 2.0,
) -> Figure:
    """Gantt chart of a replayed schedule (:func:`distlab.viz.pipeline_plots.draw_timeline`):
    one row per rank, F boxes blue, B boxes green, each labelled with its
    micro-batch where the label fits; white gaps are the bubble."""
    plan = pipeline.schedule_ops(
        stages, micro_batches, schedule=schedule, virtual_stages=virtual_stages
    )
    timeline = pipeline.replay(plan, forward_time=forward_time, backward_time=backward_time)
    name = f"{schedule} (v={virtual_stages})" if schedule == "interleaved" else schedule
    width = min(NOTEBOOK_WIDTH_IN, max(6.0, timeline.makespan * 0.35))
    fig = Figure(figsize=(width, ROW_IN * stages + 1.2))
    draw_timeline(
        fig.add_subplot(),
        timeline,
        title=f"{name}, p={stages}, m={micro_batches}",
        unit="forward of one micro-batch through one stage = 1",
    )
    fig.set_layout_engine("constrained")
    return fig


def _gpu_counts(max_gpus: int) -> list[int]:
    """1, 2, 4, ... up to ``max_gpus`` (included): the x axis of the scaling plots."""
    max_gpus = int_in("max_gpus", max_gpus, 2)
    counts = [1 << k for k in range(max_gpus.bit_length()) if 1 << k <= max_gpus]
    return counts if counts[-1] == max_gpus else [*counts, max_gpus]


def plot_amdahl_gustafson(
    serial_fractions: Sequence[float] = (0.02, 0.05), *, max_gpus: int = 1024
) -> Figure:
    """Speed-up (left) and parallel efficiency (right) against the GPU count n, for each
    serial fraction s: Amdahl's strong scaling (solid, :func:`distlab.calc.scaling.amdahl_speedup`)
    flattening under its ceiling 1/s (dotted), Gustafson's weak scaling (dashed,
    :func:`~distlab.calc.scaling.gustafson_speedup`) and the ideal n (grey)."""
    counts = _gpu_counts(max_gpus)
    fig = Figure(figsize=(10, 4), layout="constrained")
    speed, eff = fig.subplots(1, 2)
    speed.plot(counts, counts, color="0.7", label="ideal: n")
    eff.axhline(1.0, color="0.7", label="ideal")
    for i, s in enumerate(serial_fractions):
        color = f"C{i}"
        amdahl = [scaling.amdahl_speedup(s, n) for n in counts]
        gustafson = [scaling.gustafson_speedup(s, n) for n in counts]
        speed.plot(counts, amdahl, color=color, label=f"Amdahl, s = {s:.0%}")
        speed.plot(counts, gustafson, color=color, ls="--", label=f"Gustafson, s = {s:.0%}")
        speed.axhline(1 / s, color=color, ls=":", label=f"Amdahl's ceiling 1/s = {1 / s:.0f}")
        eff.plot(
            counts,
            [scaling.parallel_efficiency(a, n) for a, n in zip(amdahl, counts)],
            color=color,
            label=f"Amdahl, s = {s:.0%}",
        )
        eff.plot(
            counts,
            [scaling.parallel_efficiency(g, n) for g, n in zip(gustafson, counts)],
            color=color,
            ls="--",
            label=f"Gustafson, s = {s:.0%}",
        )
    for ax in (speed, eff):
        log_scale(ax, "x", base=2)
        ax.set_xlabel("GPUs, n")
    log_scale(speed, "y", base=2)
    speed.set_ylabel("speed-up over one GPU")
    speed.set_title("Speed-up: strong (Amdahl) and weak (Gustafson) scaling")
    eff.set_ylabel("parallel efficiency, speed-up / n")
    eff.set_ylim(0, 1.05)
    eff.set_title("Efficiency")
    speed.legend(frameon=False, fontsize="small")
    eff.legend(frameon=False, fontsize="small", loc="lower left")
    return fig


def plot_straggler_probability(
    slow_probabilities: Sequence[float] = (1e-4, 1e-3), *, max_gpus: int = 16_384
) -> Figure:
    """Share of synchronous steps that wait for at least one slow GPU, against the GPU
    count, when each GPU is slow in a step with probability p, independently
    (:func:`distlab.calc.scaling.straggler_probability`: 1 - (1 - p)^n), one line per p."""
    counts = _gpu_counts(max_gpus)
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    for p in slow_probabilities:
        ax.plot(
            counts,
            [scaling.straggler_probability(p, n) for n in counts],
            marker=".",
            label=f"each GPU slow in {p:.2%} of its steps",
        )
    log_scale(ax, "x", base=2)
    ax.set_xlabel("GPUs, n")
    ax.set_ylabel("share of steps with a straggler")
    ax.set_ylim(0, 1.02)
    ax.set_title("A step waits for its slowest GPU")
    ax.legend(frameon=False, loc="upper left")
    return fig
