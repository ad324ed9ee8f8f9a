"""Collective busbw: distlab's algorithms against torch.distributed's built-ins, in one run.

    python benchmarks/collectives_busbw.py                       # all-reduce, 2 and 4 ranks
    python benchmarks/collectives_busbw.py --algorithms builtin,ring --check both
    python benchmarks/collectives_busbw.py --all                 # every collective

Prints the nccl-tests-style tables of `distlab bench`, then, measured in this run:
the algorithms of a world size are timed side by side in one job, in 7 rounds of
alternating blocks, each time the median of its blocks (``run_bench(side_by_side=True)``:
on a 2-core machine one job after another differed by up to 3x where the algorithms did
not; ``--one-job-each`` times them as ``distlab bench`` does);

* every algorithm's busbw divided by the built-in's, per world size and size (the ring's
  targets: >= 0.9x from 1 MiB up, >= 0.5x below);
* with ``--check both``: each algorithm timed with and without the agreement header every
  distlab collective exchanges first (``distlab.collectives.agree``), and the header's
  cost per call (time with it minus time without it);
* tree against ring at 4 KiB on 4 ranks (target: tree faster), when both ran.
"""

import argparse

from distlab.commands.bench import ALGORITHMS, BOTH, print_table, run_bench
from distlab.core.units import format_size

SIZES = (4096, 1 << 16, 1 << 20, 16 << 20, 64 << 20)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--all", action="store_true", help="every collective, not only all-reduce")
    parser.add_argument("--algorithms", default="", help="comma-separated (default: all)")
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument(
        "--check", choices=["on", "off", "both"], default="on",
        help="the agreement header: on (as users run it), off, or both side by side",
    )  # fmt: skip
    parser.add_argument(
        "--one-job-each", action="store_true",
        help="time each algorithm in a job of its own, one after the other (as `distlab bench`), "
        "instead of side by side in one job per world size, alternating, median of 7 rounds",
    )  # fmt: skip
    args = parser.parse_args()
    collectives = list(ALGORITHMS) if args.all else ["all_reduce"]
    algorithms = [a for a in args.algorithms.split(",") if a]
    world_sizes = tuple(int(n) for n in args.world_sizes.split(","))
    check = {"on": True, "off": False, "both": BOTH}[args.check]
    modes = [True, False] if check == BOTH else [check]
    named = algorithms or sorted({a for c in collectives for a in ALGORITHMS[c]})
    records = []
    for record in run_bench(
        world_sizes=world_sizes, collectives=collectives, algorithms=named, sizes=SIZES,
        check=check, side_by_side=not args.one_job_each,
    ):  # fmt: skip
        if record["algorithm"] == "builtin":  # it has no header: the same record serves both
            records += [{**record, "check": True}, {**record, "check": False}]
        else:
            records.append({"check": check, **record})  # BOTH's records carry their own
    if True in modes:
        print_table([r for r in records if r["check"]])
    if False in modes:
        print("\nWithout the agreement header (built-in rows: the same run's):")
        print_table([r for r in records if not r["check"]])
    print_ratios(records, collectives, world_sizes, modes)


def _pick(records, collective, algorithm, n, size, check):
    return next(
        (
            r
            for r in records
            if (r["collective"], r["algorithm"], r["world_size"], r["bytes"], r["check"])
            == (collective, algorithm, n, size, check)
        ),
        None,
    )


def print_ratios(records, collectives, world_sizes, modes) -> None:
    sizes = sorted({r["bytes"] for r in records})
    head = "".join(f"{format_size(s):>10}" for s in sizes)
    for collective in collectives:
        names = sorted({r["algorithm"] for r in records if r["collective"] == collective})
        print(f"\n{collective}: busbw / built-in busbw (measured in this run)")
        print(f"{'algorithm':<24}{'ranks':>6}{'header':>8}{head}")
        for name in [a for a in names if a != "builtin"]:
            for n in world_sizes:
                for check in modes:
                    cells = []
                    for size in sizes:
                        mine = _pick(records, collective, name, n, size, check)
                        base = _pick(records, collective, "builtin", n, size, True)
                        ok = mine and base and base["busbw_GBps"]
                        cells.append(f"{mine['busbw_GBps'] / base['busbw_GBps']:>10.2f}" if ok
                                     else f"{'-':>10}")  # fmt: skip
                    label = "on" if check else "off"
                    print(f"{name:<24}{n:>6}{label:>8}{''.join(cells)}")
        if len(modes) == 2:
            print(f"\n{collective}: the header's cost per call, microseconds (with - without)")
            print(f"{'algorithm':<24}{'ranks':>6}{'':>8}{head}")
            for name in [a for a in names if a != "builtin"]:
                for n in world_sizes:
                    cells = []
                    for size in sizes:
                        on = _pick(records, collective, name, n, size, True)
                        off = _pick(records, collective, name, n, size, False)
                        cells.append(f"{(on['time_s'] - off['time_s']) * 1e6:>10.0f}" if on and off
                                     else f"{'-':>10}")  # fmt: skip
                    print(f"{name:<24}{n:>6}{'':>8}{''.join(cells)}")
    tree = _pick(records, "all_reduce", "tree", 4, 4096, True)
    ring = _pick(records, "all_reduce", "ring", 4, 4096, True)
    if tree and ring:
        ratio = tree["time_s"] / ring["time_s"]
        print(f"\ntree / ring all-reduce time at 4 KiB, 4 ranks: {ratio:.2f}x (target < 1)")


if __name__ == "__main__":
    main()
