"""Every figure a notebook draws can be read at 100 % zoom: no text under 7 pt once the figure
fits a notebook's output area, no two texts on top of each other, no hatch lines through text.

Each figure is drawn with the arguments its notebook uses (the same ranks, chunks and
micro-batches, so the same size), on small synthetic inputs where the notebook measures
something, once per kind of picture (two of notebook 02's six collectives, the Gantt
charts of one chunk, of several, of a split backward);
:func:`distlab.viz.legibility.assert_legible` draws it with Agg and checks the extents of
the texts really drawn. :func:`test_every_figure_a_notebook_draws_is_checked`
keeps the list complete: a plot function a notebook starts to call fails it until it is here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from distlab.viz.legibility import assert_legible, problems  # draws with Agg, no pyplot

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------- nb02, nb03 ---
def _collective(name):
    from distlab.viz import collective_plots

    return lambda: collective_plots.plot_collective(name, world_size=4)


def _steps(builder_name):
    def draw():
        from distlab import collectives
        from distlab.viz import collective_plots

        return collective_plots.plot_steps(getattr(collectives, builder_name)(4), columns=5)

    return draw


def _ring_player_step():
    from distlab.collectives import ring_all_reduce_schedule
    from distlab.viz import collective_plots

    return collective_plots.plot_step(ring_all_reduce_schedule(4), 3)


def _cost_breakdown():
    from distlab.sim.topology import NVLINK4
    from distlab.viz import cost_plots

    return cost_plots.plot_cost_breakdown(
        8, NVLINK4, sizes=[4 * 2**10, 2**30], algorithms=["ring_all_reduce", "tree_all_reduce"]
    )


def _bench_records():
    times = {("builtin", 4096): 3e-4, ("ring", 4096): 6e-4, ("tree", 4096): 5e-4}
    times |= {("builtin", 2**22): 1.1e-3, ("ring", 2**22): 2.4e-3, ("tree", 2**22): 2.9e-3}
    return [
        {"collective": "all_reduce", "algorithm": a, "world_size": 4, "bytes": n, "time_s": t}
        for (a, n), t in times.items()
    ]


def _bench():
    from distlab.viz import cost_plots

    return cost_plots.plot_bench(_bench_records())


def _time_vs_size():
    from distlab.sim.topology import NVLINK4
    from distlab.viz import sim_plots

    algorithms = ["ring_all_reduce", "tree_all_reduce", "double_binary_tree_all_reduce"]
    algorithms.append("halving_doubling_all_reduce")
    return sim_plots.plot_time_vs_size(8, NVLINK4, algorithms=algorithms, method="closed_form")


def _predicted_vs_measured():
    from distlab.sim.fit import Prediction
    from distlab.viz import sim_plots

    points = [
        Prediction("all_reduce", a, 4, n, t, t * f)
        for a, f in (("ring", 1.0), ("tree", 1.3), ("builtin", 0.8))
        for n, t in ((4096, 4e-4), (2**22, 2.5e-3))
    ]
    return sim_plots.plot_predicted_vs_measured(points)


def _link_bandwidths():
    from distlab.viz import cost_plots

    return cost_plots.plot_link_bandwidths()


# ---------------------------------------------------------------- nb04, nb07 ---
def _step_trace():
    from distlab.parallel.data.step_trace import BucketTimes, StepTrace
    from distlab.viz import overlap_plots

    buckets = [BucketTimes(i, 2**20, 0.004 + 0.002 * i, 0.0045 + 0.002 * i, 0.006 + 0.002 * i)
               for i in range(4)]  # fmt: skip
    trace = StepTrace(0.0, 0.003, 0.011, 0.0125, buckets)
    return overlap_plots.plot_step_trace(trace)


def _step_times():
    from distlab.viz import overlap_plots

    rows = [("per tensor, after backward (NaiveDDP)", 0.031), ("buckets, after backward", 0.024)]
    rows.append(("buckets, overlapped", 0.019))
    return overlap_plots.plot_step_times(rows, title="forward + backward + gradient sync, 2 ranks")


def _block_collectives():
    from distlab.parallel.tensor.ops import CommEvent
    from distlab.viz import tensor_plots

    events = [
        CommEvent("forward", "all_reduce", "attn.proj out", 512),
        CommEvent("forward", "all_reduce", "mlp.fc2 out", 512),
        CommEvent("backward", "all_reduce", "mlp in", 512),
        CommEvent("backward", "all_reduce", "attn in", 512),
    ]
    return tensor_plots.plot_block_collectives(
        events, title="tensor parallelism: f and g in one block"
    )


def _activation_bytes():
    from distlab.calc.memory import activation_bytes_per_layer
    from distlab.viz import tensor_plots

    shape = {"seq_len": 16, "micro_batch": 2, "hidden": 64, "heads": 8}
    measured = {
        (t, sp): activation_bytes_per_layer(**shape, tp=t, sequence_parallel=sp)
        for t, sp in ((1, False), (2, False), (2, True))
    }
    selective = {
        2: activation_bytes_per_layer(**shape, tp=2, sequence_parallel=True, recompute="selective")
    }
    return tensor_plots.plot_activation_bytes(measured, selective=selective, **shape)


# ---------------------------------------------------------------------- nb08 ---
def _timelines(*specs, planned_and_measured=False):
    """``specs``: (schedule name, chunks) pairs, replayed as notebook 08 does (p=4, m=8)."""

    def draw():
        from distlab.parallel.pipeline import build, replay
        from distlab.viz import pipeline_plots

        timelines = []
        for name, m, chunks in specs:
            split = name.startswith(("zb", "dualpipe"))
            timelines.append(
                replay(
                    build(name, 4, m, chunks=chunks),
                    forward_time=1,
                    backward_time=2,
                    **({"weight_fraction": 0.5} if split else {}),
                )
            )
        if planned_and_measured:
            slower = replay(build(specs[0][0], 4, specs[0][1]), forward_time=1.3, backward_time=2.4)
            return pipeline_plots.plot_planned_and_measured(timelines[0], slower)
        return pipeline_plots.plot_timelines(*timelines, unit="slots")

    return draw


# ----------------------------------------------------------------- nb09, nb11, nb13 ---
def _comm_comparison():
    from distlab.core.layout import Layout
    from distlab.placement import compare_placements
    from distlab.sim.topology import preset
    from distlab.viz import placement_plots

    return placement_plots.plot_comm_comparison(
        compare_placements(Layout(tp=8, pp=2, dp=4), preset("dgx-h100", nodes=8))
    )


def _placement():
    from distlab.core.layout import Layout
    from distlab.placement import place
    from distlab.sim.topology import preset
    from distlab.viz import placement_plots

    job = Layout(tp=2, pp=2, dp=4, micro_batches=8, order="tp-cp-ep-dp-pp")
    return placement_plots.plot_placement(
        place(job, preset("dgx-h100", nodes=2), choose_order=False)
    )


def _scheduler_results():
    from distlab.placement.jobs import mixed_jobs
    from distlab.placement.scheduler import simulate
    from distlab.sim.topology import preset

    cluster = preset("dgx-h100", nodes=8)
    jobs = mixed_jobs(40, cluster_gpus=cluster.world_size, load=0.9, seed=0)
    return [simulate(jobs, cluster, policy=p) for p in ("first-fit", "best-fit")]


def _schedule():
    from distlab.viz import placement_plots

    return placement_plots.plot_schedule(_scheduler_results()[1])


def _waits():
    from distlab.viz import placement_plots

    return placement_plots.plot_waits([r.stats() for r in _scheduler_results()])


def _expert_load():
    import torch

    from distlab.viz import moe_plots

    steps = torch.linspace(0, 1, 40)[:, None]
    even, skewed = torch.full((40, 4), 0.25), torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    runs = {
        "no balancing loss": even + steps * (skewed - even),
        "balancing loss x 0.01 (Switch)": even + 0.3 * steps * (skewed - even),
        "balancing loss x 1.0": even,
    }
    return moe_plots.plot_expert_load(runs)


def _amdahl():
    from distlab.viz import calc_plots

    return calc_plots.plot_amdahl_gustafson((0.02, 0.05), max_gpus=1024)


def _straggler():
    from distlab.viz import calc_plots

    return calc_plots.plot_straggler_probability((1e-4, 1e-3), max_gpus=16_384)


def _overlap_timelines():
    from distlab.parallel.tensor.overlap import Timeline
    from distlab.viz import tp_overlap_plots

    def timeline(rank, spans):
        t = Timeline(rank)
        for kind, start, end in spans:
            t.add(kind, start / 1e3, end / 1e3)
        return t

    serial = [timeline(r, [("comm", 0, 4), ("compute", 4, 12)]) for r in range(2)]
    overlapped = [
        timeline(r, [("compute", 0, 4), ("comm", 0, 3), ("compute", 4, 8)]) for r in range(2)
    ]
    return tp_overlap_plots.plot_overlap_timelines(serial, overlapped)


#: figure name -> (the plot functions it shows, as ``module.function``; how to draw it)
FIGURES = {
    **{
        f"02 {c}": ("collective_plots.plot_collective", _collective(c))
        for c in ("reduce_scatter", "all_to_all")  # sums and faded leftovers; two-letter labels
    },
    "02 ring all-reduce player, one step": (
        "collective_plots.ring_all_reduce_player",  # its frame; without widgets, plot_steps
        _ring_player_step,
    ),
    "03 cost breakdown": ("cost_plots.plot_cost_breakdown", _cost_breakdown),
    "03 tree steps": ("collective_plots.plot_steps", _steps("tree_all_reduce_schedule")),
    "03 double binary tree steps": (
        "collective_plots.plot_steps",
        _steps("double_binary_tree_all_reduce_schedule"),
    ),
    "03 halving-doubling steps": (
        "collective_plots.plot_steps",
        _steps("halving_doubling_all_reduce_schedule"),
    ),
    "03 time vs size": ("sim_plots.plot_time_vs_size", _time_vs_size),
    "03 bench": ("cost_plots.plot_bench", _bench),
    "03 predicted vs measured": ("sim_plots.plot_predicted_vs_measured", _predicted_vs_measured),
    "03 link bandwidths": ("cost_plots.plot_link_bandwidths", _link_bandwidths),
    "04 step trace": ("overlap_plots.plot_step_trace", _step_trace),
    "04 step times": ("overlap_plots.plot_step_times", _step_times),
    "07 block collectives": ("tensor_plots.plot_block_collectives", _block_collectives),
    "07 activation bytes": ("tensor_plots.plot_activation_bytes", _activation_bytes),
    "08 1f1b planned and measured": (
        "pipeline_plots.plot_planned_and_measured",
        _timelines(("1f1b", 8, 1), planned_and_measured=True),
    ),
    "08 interleaved and 1f1b": (
        "pipeline_plots.plot_timelines",
        _timelines(("interleaved", 8, 2), ("1f1b", 8, 1)),
    ),
    "08 zb_v": ("pipeline_plots.plot_timelines", _timelines(("zb_v", 8, 2))),
    "08 zb_h2 and dualpipe_v": (
        "pipeline_plots.plot_timelines",
        _timelines(("zb_h2", 8, 1), ("dualpipe_v", 8, 2)),
    ),
    "09 comm comparison": ("placement_plots.plot_comm_comparison", _comm_comparison),
    "09 placement": ("placement_plots.plot_placement", _placement),
    "09 expert load": ("moe_plots.plot_expert_load", _expert_load),
    "09 schedule": ("placement_plots.plot_schedule", _schedule),
    "09 waits": ("placement_plots.plot_waits", _waits),
    "11 amdahl and gustafson": ("calc_plots.plot_amdahl_gustafson", _amdahl),
    "11 straggler": ("calc_plots.plot_straggler_probability", _straggler),
    "13 overlap timelines": ("tp_overlap_plots.plot_overlap_timelines", _overlap_timelines),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_figure_is_legible(name):
    _, draw = FIGURES[name]
    assert_legible(draw(), name)


def _notebook_plot_calls() -> set[str]:
    """``module.function`` for every distlab.viz plot function a solution notebook calls."""
    called = set()
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        called |= {".".join(m) for m in re.findall(r"\b(\w+_plots)\.(plot_\w+|\w+_player)\(", code)}
        for module, names in re.findall(r"from distlab\.viz\.(\w+) import ([\w, ]+)", code):
            called |= {f"{module}.{n.strip()}" for n in names.split(",")}
    return called


def test_every_figure_a_notebook_draws_is_checked():
    called = _notebook_plot_calls()
    assert "pipeline_plots.plot_timelines" in called and len(called) > 10, called
    checked = {function for function, _ in FIGURES.values()}
    assert called <= checked, f"add these to FIGURES: {sorted(called - checked)}"


def test_the_checker_names_what_it_finds():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 2))
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, "chunk 0", fontsize=7)
    ax.text(0.52, 0.5, "chunk 1", fontsize=7)
    ax.text(0.1, 0.1, "tiny", fontsize=5)
    ax.bar([0.8], [0.5], width=0.2, hatch="///")
    ax.text(0.8, 0.2, "on the hatch", fontsize=8, ha="center")
    found = problems(fig)
    assert any("overlap" in p and "'chunk 0'" in p and "'chunk 1'" in p for p in found), found
    assert any("under 7 pt" in p and "'tiny'" in p for p in found), found
    assert any("hatched" in p and "'on the hatch'" in p for p in found), found
    wide = Figure(figsize=(16, 2))
    wide.add_subplot().set_title("shrunk", fontsize=8)
    assert any("shown at" in p for p in problems(wide))
    with pytest.raises(AssertionError, match="figure 'demo' is hard to read"):
        assert_legible(fig, "demo")


def test_log_axes_label_ticks_in_plain_numbers():
    from matplotlib.figure import Figure

    from distlab.viz.legibility import drawn_texts
    from distlab.viz.style import log_scale

    def tick_labels(low, high):
        fig = Figure()
        ax = fig.add_subplot()
        ax.plot([low, high], [low, high])
        log_scale(ax)
        texts, _, _ = drawn_texts(fig)
        return {t.text for t in texts}

    assert {"20", "30", "40", "60"} <= tick_labels(20, 90)  # not 2×10^1
    assert {"0.3", "0.4", "0.6", "1", "2"} <= tick_labels(0.3, 2.5)
    assert {"10", "1,000", "10,000"} <= tick_labels(10, 30_000)
    far = tick_labels(2e-5, 7e-5)  # beyond the plain range: 10^n, and 2e-5 for the others
    assert "2e−5" in far and not [t for t in far if "times" in t]
    with pytest.raises(ValueError, match="which must be"):
        log_scale(Figure().add_subplot(), "z")
