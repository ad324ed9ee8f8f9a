"""3D parallelism against data parallelism and one process: step time, memory, bytes per rank.

    python benchmarks/three_d.py [--steps 6] [--batch 16] [--micro-batches 2]
                                 [--seq-len 32] [--hidden 64] [--heads 4] [--layers 4]
                                 [--optimizer sgd_momentum]

Trains the same tiny GPT on the same global batch with the same optimizer
(SGD with momentum: one state tensor per parameter, which ZeRO-1 shards)
four ways, all through :func:`distlab.parallel.compose.three_d.train_3d` on gloo processes:

* ``single``: 1 process, every degree 1 and one micro-batch (a plain forward
  and backward of the whole batch);
* ``DP=8``: 8 processes, tp = pp = 1 (each rank the whole model, batch/8);
* ``TP2xPP2xDP2``: 8 processes, 1F1B over ``--micro-batches`` per replica,
  gradients all-reduced over dp;
* ``... ZeRO-1``: the same with ZeRO-1 over dp (``zero_stage=1``).

and prints three things from one invocation:

1. the communication of one traced TP2xPP2xDP2 step, per group and
   collective, against :func:`distlab.calc.three_d.three_d_comm`
   (:func:`distlab.parallel.compose.traffic.trace_three_d`): with plain DP, with
   ZeRO-1 (its one-time broadcast included), and with the interleaved schedule
   (v = 2 chunks; only when 4 divides ``--layers`` and 2 ``--micro-batches``);
2. the same layout's step time on one DGX-H100 node (8 GPUs), from the planner
   and from each group's traffic on its link
   (:func:`distlab.calc.three_d.layout_step_time`), for this tiny GPT and for
   LLaMA-2 7B (the planner's ``7B`` preset, micro-batch 1, 8 micro-batches);
3. one benchmark table from one run of each layout: the median step time of the slowest rank
(:attr:`~distlab.parallel.compose.three_d.ThreeDRun.step_seconds`, the first step left out as
warm-up), the largest per-rank parameter, gradient and optimizer-state bytes at the end of
the run (the rank's parameters, as many gradient bytes, and
:attr:`~distlab.parallel.compose.three_d.ThreeDRun.optimizer_state_bytes`), the largest peak
activation bytes the pipeline executor kept
(:attr:`~distlab.parallel.compose.three_d.ThreeDRun.peak_activation_bytes`), the
largest peak RSS of a process, and the most bytes a rank sent per step
(:func:`~distlab.parallel.comm.trace.trace_comm`'s wire bytes: distlab's ring
collectives, pipeline messages and their headers; ZeRO-1's one-time parameter
broadcast left out). CPU timings on a shared
machine are noisy; bytes are exact.
"""

from __future__ import annotations

import argparse
import statistics

import distlab

LAYOUTS = {  # name: (processes, tp, pp, dp, micro-batches per replica or None for
    # --micro-batches, ZeRO stage)
    "single": (1, 1, 1, 1, 1, 0),
    "DP=8": (8, 1, 1, 8, 1, 0),
    "TP2xPP2xDP2": (8, 2, 2, 2, None, 0),
    "TP2xPP2xDP2 ZeRO-1": (8, 2, 2, 2, None, 1),
}
TRACED = {  # name: train_3d options of a traced TP2xPP2xDP2 step
    "plain DP": {},
    "ZeRO-1": {"zero_stage": 1},
    "interleaved (v = 2)": {"schedule": "interleaved", "chunks": 2},
}


def _worker(rank, world_size, config, tp, pp, dp, batch, micro_batches, steps, options):
    import resource

    import torch

    from distlab.models import gpt_batch
    from distlab.parallel.comm.trace import trace_comm
    from distlab.parallel.compose.three_d import train_3d

    torch.set_num_threads(1)
    tokens, targets = gpt_batch(batch, config, seed=1)
    with trace_comm() as trace:
        run = train_3d(config, tokens, targets, tp=tp, pp=pp, dp=dp,
                       micro_batches=micro_batches, steps=steps, lr=0.1, **options)  # fmt: skip
    per_step = [c for c in trace.calls if c.collective != "broadcast"]  # ZeRO-1's is once
    param_bytes = sum(t.numel() * t.element_size() for t in run.shards.values())
    return {
        "step_times": run.step_seconds[1:],  # the first step is warm-up
        "state": 2 * param_bytes + run.optimizer_state_bytes,  # parameters and gradients
        "activations": run.peak_activation_bytes,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "sent_per_step": sum(c.wire_bytes for c in per_step) / steps,
    }


def benchmark_rows(
    config, *, batch: int, micro_batches: int, steps: int, optimizer: str
) -> list[tuple]:
    """One row per layout: (name, processes, step seconds, state, activations, RSS, sent)."""
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (the first is warm-up), got {steps}")
    rows = []
    for name, (procs, tp, pp, dp, m, zero_stage) in LAYOUTS.items():
        m = micro_batches if m is None else m
        options = {"zero_stage": zero_stage, "optimizer": optimizer}
        per_rank = distlab.run(
            _worker, procs, args=(config, tp, pp, dp, batch, m, steps, options), timeout=600
        )
        slowest = statistics.median(max(s) for s in zip(*(r["step_times"] for r in per_rank)))
        rows.append((name, procs, slowest, *(max(r[k] for r in per_rank)
                     for k in ("state", "activations", "rss", "sent_per_step"))))  # fmt: skip
    return rows


def format_rows(rows: list[tuple]) -> str:
    from distlab.core.units import format_bytes

    header = ("layout", "procs", "step ms", "param+grad+opt/rank", "peak act/rank",
              "peak RSS/proc", "sent/rank/step")  # fmt: skip
    lines = ["{:<19} {:>5} {:>9} {:>20} {:>14} {:>14} {:>15}".format(*header)]
    for name, procs, seconds, state, act, rss, sent in rows:
        kib = [format_bytes(x, "KiB", 1) for x in (state, act)]
        lines.append(
            f"{name:<19} {procs:>5} {seconds * 1e3:>9.1f} {kib[0]:>20} {kib[1]:>14} "
            f"{format_bytes(rss, 'MiB', 0):>14} {format_bytes(sent, 'KiB', 1):>15}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from distlab.models import GPTConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--optimizer", default="sgd_momentum", help="sgd, sgd_momentum or adam")
    args = parser.parse_args(argv)
    config = GPTConfig(vocab=args.vocab, seq_len=args.seq_len, hidden=args.hidden,
                       heads=args.heads, layers=args.layers)  # fmt: skip
    from distlab.calc.planner import PlannerAssumptions
    from distlab.calc.three_d import format_layout_time, gpt_spec, layout_step_time
    from distlab.calc.transformer import model_preset
    from distlab.core.layout import Layout
    from distlab.parallel.compose.traffic import format_trace_table, trace_three_d
    from distlab.sim.topology import preset

    interleaves = args.layers % 4 == 0 and args.micro_batches % 2 == 0
    for name, options in TRACED.items():
        if "chunks" in options and not interleaves:
            print(f"{name}: skipped (needs 4 | --layers and 2 | --micro-batches)\n")
            continue
        rows = trace_three_d(config, tp=2, pp=2, dp=2, batch=args.batch,
                             micro_batches=args.micro_batches, **options)  # fmt: skip
        print(f"one TP2xPP2xDP2 step, {name}, summed over the 8 ranks: "
              "measured / distlab.calc prediction")  # fmt: skip
        print(format_trace_table(rows) + "\n")
    spec = gpt_spec(vocab=config.vocab, seq_len=config.seq_len, hidden=config.hidden,
                    heads=config.heads, layers=config.layers)  # fmt: skip
    dgx = preset("dgx-h100", nodes=1)
    local = args.batch // (2 * args.micro_batches)
    fp32 = PlannerAssumptions(recipe="fp32_adam")  # as traced; 7B in the planner's bf16 default
    cases = ((spec, local, args.micro_batches, fp32), (model_preset("7B"), 1, 8, None))
    for model, b, m, assume in cases:  # the planner prices Megatron's run, with SP
        layout = Layout(tp=2, pp=2, dp=2, micro_batch=b, micro_batches=m, sequence_parallel=True)
        step = layout_step_time(model, dgx, layout, assumptions=assume)
        print(format_layout_time(f"{model.name} on 1 DGX-H100 node", step))
    print()
    rows = benchmark_rows(config, batch=args.batch, micro_batches=args.micro_batches,
                          steps=args.steps, optimizer=args.optimizer)  # fmt: skip
    print(
        f"tiny GPT: {config.layers} layers, hidden {config.hidden}, seq_len {config.seq_len}, "
        f"vocab {config.vocab}, fp32 {args.optimizer}; global batch {args.batch}; gloo on CPU, "
        f"median of {args.steps - 1} steps (slowest rank)"
    )
    print(format_rows(rows))


if __name__ == "__main__":
    main()
