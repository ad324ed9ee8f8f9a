"""Naive against bucketed DDP: step time measured side by side in one run.

    python benchmarks/ddp_overlap.py [--world-size 2] [--steps 10] [--bucket-mb 4]
                                     [--algorithm ring] [--plot trace.png]

Runs :func:`distlab.parallel.data.ddp_timing.time_ddp_variants` on real gloo
processes: the same MLP, the same data, the three variants taking turns step
by step. Prints, per variant, the median step time of the slowest rank, the
collectives issued per step, the ratio naive / variant, and (bucketed) how
long the step waited for communication after backward ended. ``--plot``
saves one step of the overlapping variant as a timeline
(:func:`distlab.viz.overlap_plots.plot_step_trace`).
"""

from __future__ import annotations

import argparse
import itertools

import distlab
from distlab.parallel.data.ddp_timing import format_table, summarise, time_ddp_variants


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128, help="samples per rank")
    parser.add_argument("--sizes", default="512,1024,1024,1024,1024,512", help="MLP widths")
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="bucket cap in MiB")
    parser.add_argument("--algorithm", default="ring", help="ring, tree, ... or builtin")
    parser.add_argument("--plot", help="save one overlapping step's timeline to this file")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    per_rank = distlab.run(
        _worker,
        args.world_size,
        args=(sizes, args.batch, args.steps, args.warmup, args.algorithm, args.bucket_mb),
        timeout=600,
    )
    n_params = sum(a * b + b for a, b in itertools.pairwise(sizes))
    print(
        f"{args.world_size} gloo ranks, MLP {sizes} ({n_params:,} parameters, "
        f"{n_params * 4 / 2**20:.1f} MiB of fp32 gradients), {args.batch} samples per rank, "
        f"algorithm {args.algorithm!r}, buckets of {args.bucket_mb} MiB, "
        f"median of {args.steps} steps (slowest rank per step)"
    )
    print(format_table(summarise(per_rank)))
    if args.plot:
        from distlab.viz.overlap_plots import plot_step_trace

        trace = per_rank[0]["bucketed_overlap"].traces[-1]
        plot_step_trace(trace).savefig(args.plot, dpi=120)
        print(f"timeline of one step saved to {args.plot}")


def _worker(rank, world_size, sizes, batch, steps, warmup, algorithm, bucket_mb):
    import torch

    torch.set_num_threads(1)  # one core per rank
    return time_ddp_variants(
        rank,
        world_size,
        sizes=sizes,
        batch=batch,
        steps=steps,
        warmup=warmup,
        algorithm=algorithm,
        bucket_cap_mb=bucket_mb,
    )


if __name__ == "__main__":
    main()
