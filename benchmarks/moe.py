"""Expert parallelism: step time and all-to-all bytes per rank, measured against predicted.

    python benchmarks/moe.py [--ep 1,2,4] [--tokens 256] [--hidden 64] [--experts 8]
                             [--top-k 2] [--steps 5] [--plot load.png]

For each expert-parallel size, one MoE layer (forward and backward) on real
gloo ranks, with distlab's pairwise all-to-all and with the built-in one taking
turns. Prints the median step time of the slowest rank and the bytes each rank
sent through distlab's all-to-all per step, next to
:func:`distlab.calc.moe.moe_all_to_all_comm`. ``--plot`` saves the expert
load of a short single-process training run with and without the
load-balancing loss (:func:`distlab.viz.moe_plots.plot_expert_load`).
"""

from __future__ import annotations

import argparse
import statistics

import distlab
from distlab.calc.moe import moe_all_to_all_comm

ALGORITHMS = ("pairwise", "builtin")


def _worker(rank, world_size, tokens, hidden, experts, top_k, steps):
    import time

    import torch
    import torch.distributed as dist

    from distlab.collectives import count_traffic
    from distlab.parallel.moe.layer import ExpertParallelMoE, MoE

    dense = MoE(hidden, 4 * hidden, experts, top_k=top_k, capacity_factor=1.25)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(rank))
    x.requires_grad_(True)  # as inside a model: the dispatch all-to-all has a backward too
    times = {a: [] for a in ALGORITHMS}
    sent = {}
    layers = {a: ExpertParallelMoE.from_dense(dense, algorithm=a) for a in ALGORITHMS}
    for step in range(steps + 1):  # step 0 warms up
        for algorithm, layer in layers.items():
            dist.barrier()
            start = time.perf_counter()
            with count_traffic() as traffic:
                layer(x).sum().backward()
            elapsed = torch.tensor(time.perf_counter() - start)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if step:
                times[algorithm].append(elapsed.item())
            sent[algorithm] = traffic.bytes_sent
    return times, sent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", default="1,2,4", help="expert-parallel sizes (world sizes)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--plot", help="save the expert-load figure to this file")
    args = parser.parse_args(argv)
    print(
        f"MoE layer: {args.experts} experts, top-{args.top_k}, capacity factor 1.25, "
        f"{args.tokens} tokens x hidden {args.hidden} per rank; median of {args.steps} "
        "forward+backward steps (slowest rank); bytes = sent per rank per step"
    )
    print(f"{'ep':>3} {'algorithm':>9} {'ms/step':>8} {'bytes measured':>15} {'predicted':>10}")
    for ep in (int(e) for e in args.ep.split(",")):
        times, sent = distlab.run(
            _worker,
            ep,
            args=(args.tokens, args.hidden, args.experts, args.top_k, args.steps),
            timeout=600,
        )[0]
        predicted = moe_all_to_all_comm(
            tokens=args.tokens, hidden=args.hidden, num_experts=args.experts, ep=ep,
            top_k=args.top_k, capacity_factor=1.25, bytes_per_element=4,
        ).total  # fmt: skip
        for algorithm in ALGORITHMS:
            measured = f"{sent[algorithm]:,}" if algorithm == "pairwise" else "(not counted)"
            ms = 1e3 * statistics.median(times[algorithm])
            print(f"{ep:>3} {algorithm:>9} {ms:>8.2f} {measured:>15} {predicted:>10,.0f}")
    if args.plot:
        from distlab.parallel.moe.layer import load_balance_run
        from distlab.viz.moe_plots import plot_expert_load

        runs = {f"aux loss x {w}": load_balance_run(aux_weight=w) for w in (0.0, 1.0)}
        plot_expert_load(runs).savefig(args.plot)
        print(f"expert load figure saved to {args.plot}")


if __name__ == "__main__":
    main()
