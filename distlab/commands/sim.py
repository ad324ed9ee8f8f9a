"""``distlab sim``: replay collective algorithms on a modelled cluster, nccl-tests style.

    distlab sim --algorithm ring --collective all_reduce --cluster dgx-h100 --nodes 2 --sizes 4KiB:1GiB
    distlab sim --algorithm ring,tree,hierarchical_shard --nodes 4 --json
    distlab sim --cluster-file my_cluster.yaml --world-size 12

Prints, for each algorithm and size: time, algbw and busbw (GB/s = 1e9 B/s,
busbw factors as nccl-tests defines them) and the port that limited the
slowest step.
"""

from __future__ import annotations

import argparse
import json
import sys

from distlab.core.checks import cli, nonnegative, positive_int
from distlab.core.units import format_size, size_range
from distlab.sim.algorithms import algorithm_name, build_schedule
from distlab.sim.replay import SimResult, simulate
from distlab.sim.topology import PRESETS, ClusterSpec, load_cluster, preset


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sim",
        help="simulate collectives on a modelled cluster (alpha-beta replay)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--collective", default="all_reduce", help="all_reduce (default), reduce_scatter, ..."
    )
    p.add_argument(
        "--algorithm",
        default="ring",
        help="algorithm(s), comma-separated: ring, tree, double_binary_tree, halving_doubling, "
        "hierarchical, hierarchical_shard, naive, pairwise (all_to_all)",
    )
    p.add_argument("--cluster", default="dgx-h100", help=f"preset: {', '.join(sorted(PRESETS))}")
    p.add_argument("--cluster-file", help="a cluster spec in JSON or YAML (overrides --cluster)")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the preset's)")
    p.add_argument(
        "--world-size",
        type=cli(positive_int, integer=True),
        help="ranks (default: every GPU of the cluster)",
    )
    p.add_argument(
        "--sizes",
        default="4KiB:1GiB",
        help="lo:hi (doubling, ends at hi), lo:hi:factor or a comma list, e.g. 4KiB:1GiB",
    )
    p.add_argument(
        "--factor", type=int, default=2, help="size multiplier in a lo:hi range (default 2)"
    )
    p.add_argument("--itemsize", type=int, default=4, help="bytes per element (default 4, float32)")
    p.add_argument(
        "--gamma", type=cli(nonnegative), default=0.0, help="seconds per byte reduced (default 0)"
    )
    p.add_argument("--json", action="store_true", help="print JSON records instead of tables")
    p.set_defaults(func=run)


def cluster_from_args(args: argparse.Namespace) -> ClusterSpec:
    cluster = load_cluster(args.cluster_file) if args.cluster_file else preset(args.cluster)
    return cluster if args.nodes is None else cluster.with_nodes(args.nodes)


def simulate_sizes(
    algorithm: str, collective: str, cluster: ClusterSpec, world_size: int, sizes: list[int], **kw
) -> list[SimResult]:
    """Replay one algorithm at every size."""
    name = algorithm_name(algorithm, collective)
    schedule = build_schedule(name, world_size, ranks_per_node=cluster.gpus_per_node)
    return [simulate(schedule, cluster, size, **kw) for size in sizes]


def record(result: SimResult, algorithm: str, itemsize: int) -> dict:
    """One JSON record, shaped like ``distlab bench --json``'s."""
    return {
        "collective": result.collective,
        "algorithm": algorithm,
        "world_size": result.world_size,
        "cluster": result.cluster,
        "bytes": result.n_bytes,
        "count": result.n_bytes // itemsize,
        "time_s": result.time_s,
        "algbw_GBps": result.algbw_GBps,
        "busbw_GBps": result.busbw_GBps,
        "steps": len(result.step_times_s),
        "bottleneck": _bottleneck(result),
        "bytes_per_link_class": result.bytes_per_link_class,
    }


def run(args: argparse.Namespace) -> int:
    cluster = cluster_from_args(args)
    world_size = args.world_size or cluster.world_size
    sizes = size_range(args.sizes, args.factor)
    records = []
    for algorithm in [a.strip() for a in args.algorithm.split(",") if a.strip()]:
        results = simulate_sizes(
            algorithm,
            args.collective,
            cluster,
            world_size,
            sizes,
            itemsize=args.itemsize,
            gamma=args.gamma,
        )
        records += [record(r, algorithm, args.itemsize) for r in results]
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        _print_tables(records, cluster, world_size)
    return 0


def _bottleneck(result: SimResult) -> str:
    """The port that limited the longest step."""
    longest = max(
        range(len(result.step_times_s)), key=result.step_times_s.__getitem__, default=None
    )
    return "" if longest is None else result.step_bottlenecks[longest]


def _print_tables(records: list[dict], cluster: ClusterSpec, world_size: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)  # no wrapping in pipes
    for algorithm in dict.fromkeys(r["algorithm"] for r in records):
        rows = [r for r in records if r["algorithm"] == algorithm]
        table = Table(
            title=f"{algorithm} {rows[0]['collective']} on {cluster.name}: {world_size} ranks, "
            f"{cluster.nodes} nodes x {cluster.gpus_per_node} GPUs (simulated)"
        )
        for column in ("size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "limited by"):
            table.add_column(column, justify="left" if column == "limited by" else "right")
        for r in rows:
            table.add_row(
                format_size(r["bytes"]),
                str(r["count"]),
                f"{r['time_s'] * 1e6:.2f}",
                f"{r['algbw_GBps']:.2f}",
                f"{r['busbw_GBps']:.2f}",
                r["bottleneck"],
            )
        console.print(table)
