"""Collective busbw: distlab's algorithms against torch.distributed's built-ins, in one run.

    python benchmarks/collectives_busbw.py            # all-reduce, 2 and 4 ranks, 4 KiB .. 64 MiB
    python benchmarks/collectives_busbw.py --all      # every collective

Prints the nccl-tests-style tables of `distlab bench`, then the two targets of
the foundation issue as ratios measured in this run: ring all-reduce busbw
against the built-in at 64 MiB (target >= 0.9x), and tree against ring at
4 KiB on 4 ranks (target: tree faster).
"""

import argparse

from distlab.commands.bench import ALGORITHMS, print_table, run_bench


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--all", action="store_true", help="every collective, not only all-reduce")
    args = parser.parse_args()
    collectives = list(ALGORITHMS) if args.all else ["all_reduce"]
    records = run_bench(
        world_sizes=(2, 4), collectives=collectives,
        sizes=(4096, 1 << 16, 1 << 20, 16 << 20, 64 << 20),
    )
    print_table(records)

    def pick(algorithm, n, size):
        return next(r for r in records if r["collective"] == "all_reduce"
                    and r["algorithm"] == algorithm and r["world_size"] == n and r["bytes"] == size)

    print("\nTargets (ratios measured in this run):")
    for n in (2, 4):
        ratio = pick("ring", n, 64 << 20)["busbw_GBps"] / pick("builtin", n, 64 << 20)["busbw_GBps"]
        print(f"  ring / built-in all-reduce busbw at 64 MiB, {n} ranks: {ratio:.2f}x (target >= 0.9x)")
    tree, ring = pick("tree", 4, 4096)["time_s"], pick("ring", 4, 4096)["time_s"]
    print(f"  tree / ring all-reduce time at 4 KiB, 4 ranks: {tree / ring:.2f}x (target < 1: tree faster)")


if __name__ == "__main__":
    main()
