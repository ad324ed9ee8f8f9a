"""``distlab place`` (one job on a cluster) and ``distlab schedule`` (many jobs over time)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from distlab.core.checks import cli, nonnegative, nonnegative_int, positive
from distlab.core.layout import Layout, check_order
from distlab.core.ranks import DEFAULT_ORDER
from distlab.placement.cluster import resolve_cluster
from distlab.placement.jobs import mixed_jobs
from distlab.placement.placer import STRATEGIES, compare_placements, place
from distlab.placement.scheduler import random_failures, simulate


def register(subparsers) -> None:
    p = subparsers.add_parser("place", help="place one parallel job on a cluster and score it")
    _cluster_args(p, nodes=None)
    for dim in ("tp", "pp", "dp", "cp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=1, help=f"{dim} degree (default 1)")
    p.add_argument(
        "--order",
        type=_order,
        default=None,
        help=f"rank order naming all five dimensions, e.g. {DEFAULT_ORDER} (default: chosen "
        f"by score; {DEFAULT_ORDER} for the rank-order and random strategies)",
    )
    p.add_argument("--strategy", default="hierarchical", choices=STRATEGIES)
    p.add_argument(
        "--compare",
        action="store_true",
        help="score hierarchical, rank order, TP outermost, random",
    )
    p.add_argument("--zero-stage", type=int, default=0, help="ZeRO stage for the DP traffic (0-3)")
    p.add_argument(
        "--micro-batches",
        type=int,
        default=8,
        help="micro-batches per replica per step (default 8)",
    )
    p.add_argument("--seed", type=cli(nonnegative_int, integer=True), default=0)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_place)

    s = subparsers.add_parser("schedule", help="simulate a mixed queue of jobs on a cluster")
    _cluster_args(s, nodes=128)
    s.add_argument("--jobs", type=int, default=1000, help="number of jobs (default 1000)")
    s.add_argument(
        "--load", type=float, default=1.0, help="offered load, 1.0 = the cluster's GPU-hours"
    )
    s.add_argument("--policy", default="both", choices=("first-fit", "best-fit", "both"))
    s.add_argument("--no-preemption", action="store_true")
    s.add_argument(
        "--mtbf-h", type=cli(positive), default=None, help="mean hours between failures per node"
    )
    s.add_argument(
        "--repair-h", type=cli(nonnegative), default=4.0, help="hours to repair a failed node"
    )
    s.add_argument("--seed", type=cli(nonnegative_int, integer=True), default=0)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_schedule)


def _order(text: str) -> str:
    """argparse type of ``--order``: :func:`~distlab.core.layout.check_order`'s rule and words
    (every dimension named once), refused before a layout is built."""
    try:
        return check_order(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cluster_args(parser, *, nodes: int | None) -> None:
    parser.add_argument("--cluster", default="dgx-h100", help="preset name or a .json/.yaml spec")
    parser.add_argument("--nodes", type=int, default=nodes, help="override the node count")


def _place(args) -> int:
    cluster = resolve_cluster(args.cluster, nodes=args.nodes)
    layout = Layout(
        tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, ep=args.ep, zero_stage=args.zero_stage,
        micro_batches=args.micro_batches, order=args.order or DEFAULT_ORDER,
    )  # fmt: skip
    if args.compare:
        rows = compare_placements(layout, cluster, seed=args.seed)
        if args.json:
            out = [
                {
                    "placement": label,
                    "order": p.order,
                    "violations": p.violations(),
                    "seconds_per_step": s.breakdown(),
                    "total_s": s.total,
                }
                for label, p, s in rows
            ]
            print(json.dumps(out, indent=1))
        else:
            _print_comparison(rows)
        return 0
    placement = place(
        layout, cluster, strategy=args.strategy, choose_order=args.order is None, seed=args.seed
    )
    if args.json:
        score = placement.score()
        print(
            json.dumps(
                {
                    "order": placement.order,
                    "ranks": [
                        {"rank": r, "node": n, "gpu": g}
                        for r, (n, g) in enumerate(placement.locations())
                    ],
                    "violations": placement.violations(),
                    "seconds_per_step": score.breakdown(),
                    "total_s": score.total,
                },
                indent=1,
            )
        )
    else:
        print(placement.explain())
    return 0


def _print_comparison(rows) -> None:
    from rich.console import Console
    from rich.table import Table

    dims = sorted(
        {d for _, _, s in rows for d in s.breakdown()}, key=["tp", "cp", "ep", "pp", "dp"].index
    )
    table = Table(title="communication per step (ms), no overlap")
    table.add_column("placement")
    table.add_column("order")
    for d in dims:
        table.add_column(d.upper(), justify="right")
    table.add_column("total", justify="right")
    table.add_column("TP groups split")
    for label, placement, score in rows:
        per_dim = score.breakdown()
        split = next((v.split(" TP")[0] for v in placement.violations() if "TP groups" in v), "0")
        table.add_row(
            label,
            placement.order,
            *(f"{per_dim.get(d, 0) * 1e3:.2f}" for d in dims),
            f"{score.total * 1e3:.2f}",
            split,
        )
    Console().print(table)


def _schedule(args) -> int:
    cluster = resolve_cluster(args.cluster, nodes=args.nodes)
    jobs = mixed_jobs(
        args.jobs,
        cluster_gpus=cluster.world_size,
        load=args.load,
        gpus_per_node=cluster.gpus_per_node,
        seed=args.seed,
    )
    failures = []
    if args.mtbf_h is not None:
        horizon = max(j.submit_s for j in jobs) + 48 * 3600
        failures = random_failures(
            cluster,
            mtbf_s=args.mtbf_h * 3600,
            repair_s=args.repair_h * 3600,
            horizon_s=horizon,
            seed=args.seed,
        )
    policies = ("first-fit", "best-fit") if args.policy == "both" else (args.policy,)
    stats = [
        simulate(
            jobs, cluster, policy=p, preemption=not args.no_preemption, failures=failures
        ).stats()
        for p in policies
    ]
    if args.json:
        print(json.dumps([asdict(s) for s in stats], indent=1, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{args.jobs} jobs on {cluster.name} ({cluster.world_size} GPUs), load {args.load}"
    )
    table.add_column("")
    for s in stats:
        table.add_column(s.policy, justify="right")
    columns = [dict(s.rows()[1:]) for s in stats]
    names = list(dict.fromkeys(name for col in columns for name in col))
    for name in names:
        table.add_row(name, *(col.get(name, "") for col in columns))
    Console().print(table)
    return 0
