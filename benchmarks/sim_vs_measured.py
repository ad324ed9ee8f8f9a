"""Does the alpha-beta model predict real runs? Fit it on some, predict all, print the error.

    python benchmarks/sim_vs_measured.py                      # runs distlab bench (a few minutes)
    python benchmarks/sim_vs_measured.py --records bench.json # reads `distlab bench --json` output
    python benchmarks/sim_vs_measured.py --save bench.json    # runs the bench and keeps its records

1. Measured: ``distlab bench`` records (gloo, this machine).
2. Model: here the "network" is loopback TCP between processes that share a
   few CPU cores, so every byte any rank sends goes through the same cores:
   one shared medium, not a link per rank (:mod:`distlab.sim.fit`).
3. Fit alpha and beta (and gamma with ``--gamma``) by relative least squares
   on the ``--fit-on`` algorithms' all-reduce records (default: distlab's ring).
4. Predict every record by replaying its schedule on the fitted medium and
   print predicted vs measured with the relative error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from distlab.core.units import format_size
from distlab.progress import progress_bar
from distlab.sim.fit import compare, fit_alpha_beta, load_records, record_model, select

#: distlab bench runs hierarchical_all_reduce with this many ranks per node (see bench.py).
BENCH_RANKS_PER_NODE = 2


def measure(args: argparse.Namespace) -> list[dict]:
    """Run the bench ``--repeat`` times per (collective, world size), keep each
    point's fastest time (other processes on the machine only ever add time),
    and save as it goes."""
    from distlab.commands.bench import run_bench
    from distlab.core.units import size_range

    records: list[dict] = []
    collectives = args.collectives.split(",")
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    with progress_bar("bench", total=len(collectives) * len(world_sizes) * args.repeat) as bar:
        for collective in collectives:
            for n in world_sizes:
                best: dict[tuple, dict] = {}
                for attempt in range(args.repeat):
                    what = f"measuring {collective} on {n} ranks, run {attempt + 1}"
                    bar.step(what)
                    if not bar.shown:  # no bar (not a terminal): say it in the log instead
                        print(what, file=sys.stderr, flush=True)
                    for r in run_bench(
                        world_sizes=[n],
                        collectives=[collective],
                        sizes=size_range(args.sizes),
                        iters=args.iters,
                    ):
                        key = (r["algorithm"], r["bytes"])
                        if key not in best or r["time_s"] < best[key]["time_s"]:
                            best[key] = r
                    bar.advance()
                records += best.values()
                if args.save:
                    Path(args.save).write_text(json.dumps(records, indent=1))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records", help="JSON from `distlab bench --json` (default: run the bench)"
    )
    parser.add_argument("--save", help="write the measured records here")
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--collectives", default="all_reduce")
    parser.add_argument("--sizes", default="4KiB:64MiB:16")  # x16 steps, as distlab bench
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument(
        "--repeat", type=int, default=1, help="bench runs; each point keeps its fastest"
    )
    parser.add_argument("--fit-on", default="ring", help="comma-separated algorithms to fit on")
    parser.add_argument("--gamma", action="store_true", help="fit a reduction cost gamma too")
    args = parser.parse_args(argv)

    records = load_records(args.records) if args.records else measure(args)
    for r in records:
        if r["algorithm"] == "hierarchical":
            r.setdefault("ranks_per_node", BENCH_RANKS_PER_NODE)

    fit_set = select(records, algorithms=args.fit_on.split(","))
    fit = fit_alpha_beta(fit_set, fit_gamma=args.gamma)
    print("Model: one shared medium (loopback TCP between processes on shared CPU cores).")
    print(
        f"Fitted on {fit.n_points} {args.fit_on} all-reduce records: alpha = {fit.alpha * 1e6:.1f} us, "
        f"bandwidth = {fit.bandwidth / 1e9:.3f} GB/s, gamma = {fit.gamma * 1e9:.4f} ns/B, "
        f"rms relative error on the fit set = {fit.rms_relative_error:.1%}"
    )

    predictions = compare(fit, records)
    print(
        f"\n{'collective':<15}{'algorithm':<20}{'n':>3}{'size':>11}{'measured us':>14}"
        f"{'predicted us':>14}{'error':>9}"
    )
    for p in predictions:
        print(
            f"{p.collective:<15}{p.algorithm:<20}{p.world_size:>3}{format_size(p.n_bytes):>11}"
            f"{p.measured_s * 1e6:>14.1f}{p.predicted_s * 1e6:>14.1f}{p.relative_error:>+9.1%}"
        )

    print("\nmedian |error| per algorithm and collective:")
    groups: dict[tuple[str, str], list[float]] = {}
    for p in predictions:
        groups.setdefault((p.collective, p.algorithm), []).append(abs(p.relative_error))
    for (collective, algorithm), errors in groups.items():
        print(
            f"  {collective:<15}{algorithm:<20}{statistics.median(errors):>8.1%}  ({len(errors)} points)"
        )

    skipped = {}
    for r in records:
        try:
            record_model(r)
        except ValueError as exc:
            skipped[(r["collective"], r["algorithm"])] = str(exc)
    for (collective, algorithm), why in skipped.items():
        print(f"not modelled: {collective} {algorithm}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
