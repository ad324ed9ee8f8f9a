"""Pipeline bubble: the formula, the simulator and a real run, for every schedule.

    python benchmarks/pipeline_bubble.py                 # p = 4, m = 8, v = 2
    python benchmarks/pipeline_bubble.py --stages 2 --micro-batches 4 --plot bubble.png

Each schedule runs on p gloo ranks on the tiny GPT. To give every stage the
same known cost on a shared 2-core laptop, each action also sleeps a fixed
time (forward F, input-gradient I and weight-gradient W each ``--unit``
seconds per whole stage, a whole backward B two units; a chunk of an
interleaved schedule sleeps 1/v of it). A sleep takes no core, so ranks do
not fight for the CPU, and the real compute of the tiny GPT (about a
millisecond) is small against it. Columns (idle share of the step, averaged
over ranks):

* formula: :func:`distlab.calc.pipeline.bubble_fraction` (T_F = T_I = T_W for
  the zero-bubble family and DualPipeV);
* simulated: the schedule replayed with the per-stage action times measured
  in the run (:func:`distlab.sim.pipeline_replay.replay`);
* measured: the real run's timeline (the last of ``--steps`` steps);
* in span: the measured idle inside each rank's own first-to-last action
  (:attr:`~distlab.sim.pipeline_replay.Timeline.span_bubble_fraction`), the
  bubble left if each rank started its next step as soon as it is done:
  about 0 for ZB-H2 and ZB-V;
* peak in flight: rank 0's most micro-batches' activations (chunks / v; DualPipe's
  chunks are each a whole stage of one of its two copies).

The V-shaped ZB-V, DualPipeV and DualPipe and the looping interleaved and
breadth-first schedules run with 2 chunks per rank (``--virtual-stages``).
Targets: measured within 3 percentage points of the formula for every
schedule; ZB-H1 measures less idle than 1F1B.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import distlab
from distlab.calc.pipeline import bubble_fraction
from distlab.core.pipeline_schedule import LOOPING, build
from distlab.sim.pipeline_replay import replay

SCHEDULES = (
    "gpipe",
    "1f1b",
    "interleaved",
    "breadth_first",
    "zb_h1",
    "zb_h2",
    "zb_v",
    "dualpipe_v",
    "dualpipe",
)


def worker(rank, world_size, name, m, v, unit, steps):
    import torch

    from distlab.models import GPT, GPTConfig, gpt_batch
    from distlab.parallel.pipeline import gpt_stage, run_pipeline

    schedule = build(name, world_size, m, chunks=v)
    parts = world_size * v // (2 if schedule.bidirectional else 1)
    config = GPTConfig(layers=2 * parts - 2)  # one block per layer slot, 2 per model part
    stage = gpt_stage(
        GPT(config, seed=0),
        rank,
        world_size,
        chunks=v,
        placement=schedule.placement,
        bidirectional=schedule.bidirectional,
    )
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    tokens, targets = gpt_batch(2 * m, config)
    cost = {"F": unit, "B": 2 * unit, "I": unit, "W": unit}
    for _ in range(steps):
        optimizer.zero_grad()
        run = run_pipeline(schedule, stage, tokens, targets, fixed_cost=cost)
        optimizer.step()
    return run


def measured_stage_times(schedule, timeline) -> tuple[list[float], list[float], float]:
    """Mean forward and whole-backward seconds per virtual stage, and W's share of it."""
    sums: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in timeline.entries:
        j = schedule.virtual_stage(e.rank, e.action.chunk)
        sums[(e.action.kind, j)].append(e.end - e.start)
    stages = range(schedule.stages * schedule.chunks)

    def mean(kind, j):
        values = sums.get((kind, j), [0.0])
        return sum(values) / len(values)

    forward = [mean("F", j) for j in stages]
    if not any(kind == "I" for kind, _ in sums):
        return forward, [mean("B", j) for j in stages], 0.5
    split = [mean("I", j) + mean("W", j) for j in stages]
    share = sum(mean("W", j) for j in stages) / sum(split)
    # a whole backward where the schedule runs one (DualPipeV mixes both)
    backward = [mean("B", j) if (("B", j) in sums) else split[j] for j in stages]
    return forward, backward, share


def main() -> None:
    from distlab.parallel.pipeline import measured_timeline

    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--virtual-stages", type=int, default=2)
    parser.add_argument("--unit", type=float, default=0.2, help="seconds of sleep per F")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--plot", help="save the planned/measured Gantt charts of 1F1B here")
    args = parser.parse_args()
    p, m = args.stages, args.micro_batches
    print(
        f"{'schedule':<14} {'p':>2} {'m':>3} {'v':>2} {'formula':>8} {'simulated':>10} "
        f"{'measured':>9} {'in span':>8} {'peak in flight (rank 0)':>24}"
    )
    measured_of, off_target = {}, []
    for name in SCHEDULES:
        schedule = build(name, p, m, chunks=args.virtual_stages if name in LOOPING else 1)
        v = schedule.chunks
        runs = distlab.run(worker, p, args=(name, m, v, args.unit, args.steps), timeout=600)
        measured = measured_timeline(schedule, runs)
        forward, backward, share = measured_stage_times(schedule, measured)
        simulated = replay(
            schedule, forward_time=forward, backward_time=backward, weight_fraction=share
        )
        formula = bubble_fraction(p, m, schedule=name, virtual_stages=v)
        measured_of[name] = measured
        if abs(measured.bubble_fraction - formula) > 0.03:
            off_target.append(name)
        print(
            f"{name:<14} {p:>2} {m:>3} {v:>2} {formula:>8.1%} {simulated.bubble_fraction:>10.1%} "
            f"{measured.bubble_fraction:>9.1%} {measured.span_bubble_fraction:>8.1%} "
            f"{runs[0].peak_in_flight * schedule.chunk_share:>24g}"
        )
        if args.plot and name == "1f1b":
            from distlab.viz.pipeline_plots import plot_planned_and_measured

            planned = replay(schedule, forward_time=args.unit, backward_time=2 * args.unit)
            plot_planned_and_measured(planned, measured).savefig(args.plot)
    gap = measured_of["1f1b"].bubble_fraction - measured_of["zb_h1"].bubble_fraction
    print(f"\nZB-H1 idles {gap:.1%} of the step less than 1F1B (target > 0).")
    print(f"More than 3 points from the formula: {', '.join(off_target) or 'none'}.")
    print("Timings on a shared machine are noisy; run again before trusting one digit.")


if __name__ == "__main__":
    main()
