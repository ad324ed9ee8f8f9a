"""``distlab memory``, ``distlab bubble`` and ``distlab plan``: the calculators on the command line.

Each prints a rich table, or JSON with ``--json``::

    distlab memory --params 7.5e9 --recipe mixed_adam --dp 64
    distlab bubble --stages 4 --micro-batches 8
    distlab plan --model 70B --cluster dgx-h100 --nodes 16 --global-batch 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from distlab.calc import memory, pipeline
from distlab.calc.planner import PlannerAssumptions, plan
from distlab.calc.transformer import MODEL_PRESETS, ModelSpec, gpt_shape_for, model_preset
from distlab.core.checks import (
    above_zero_fraction,
    below_one,
    cli,
    fraction,
    positive,
    positive_int,
)
from distlab.core.units import GB, GiB, format_seconds
from distlab.sim.topology import PRESETS, load_cluster, preset

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def register(subparsers) -> None:
    """Add the ``memory``, ``bubble`` and ``plan`` subcommands."""
    _register_memory(subparsers)
    _register_bubble(subparsers)
    _register_plan(subparsers)


def _print_table(title: str, columns: list[str], rows: list[list[str]], notes: list[str]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console = table_console(table)
    console.print(table)
    for note in notes:
        console.print(note, highlight=False)


def table_console(table: Table) -> Console:
    """The console a table is printed on: a real terminal's own size, else the table's full width.

    Whether stdout is a terminal is asked of stdout itself, not of rich: rich believes
    ``FORCE_COLOR`` (which Jupyter kernels set), takes the pipe for a terminal, and then
    ``TERM=dumb`` makes it ignore ``COLUMNS`` and squeeze the table into 80 columns. A pipe or
    a notebook gets plain text (no escape codes) at least as wide as the table's widest row,
    or ``COLUMNS`` when that is wider.
    """
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    natural = Console(force_terminal=False, width=10_000).measure(table).maximum
    columns = os.environ.get("COLUMNS", "")
    width = max(natural, int(columns) if columns.isdigit() else 80)
    return Console(force_terminal=False, width=width)


#: argparse type of every count option (ranks, stages, layers, batch): an integer >= 1
COUNT = cli(positive_int, integer=True)


def _preset(text: str) -> str:
    """argparse type of ``--model``: a preset name, refused as the user typed it."""
    if text.upper() not in MODEL_PRESETS:
        raise argparse.ArgumentTypeError(
            f"unknown model preset {text!r}; allowed: {', '.join(MODEL_PRESETS)}"
        )
    return text


# -- distlab memory -------------------------------------------------------------


def _register_memory(subparsers) -> None:
    p = subparsers.add_parser(
        "memory", help="model-state bytes per GPU for ZeRO stages 0-3 (ZeRO paper, Table 1)"
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--params", type=cli(positive), help="number of parameters, e.g. 7.5e9")
    what.add_argument("--model", type=_preset, help=f"a model preset: {', '.join(MODEL_PRESETS)}")
    p.add_argument("--recipe", default="mixed_adam", help=f"one of {', '.join(memory.RECIPES)}")
    p.add_argument("--dp", type=COUNT, default=1, help="data-parallel ranks ZeRO shards over")
    p.add_argument(
        "--tp", type=COUNT, default=1, help="tensor-parallel ranks (split weights first)"
    )
    p.add_argument("--pp", type=COUNT, default=1, help="pipeline stages (split weights first)")
    p.add_argument(
        "--convention",
        choices=("zero_paper", "deepspeed"),
        default="zero_paper",
        help="zero_paper (default): the ZeRO paper's count; deepspeed: DeepSpeed's estimator "
        "(ZeRO-2 and 3, mixed-precision Adam, its 'GB' = 2^30 bytes)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_memory_main)


def memory_table(
    n_params: float, *, recipe: str = "mixed_adam", dp: int = 1, tp: int = 1, pp: int = 1
) -> list[dict]:
    """One row per ZeRO stage: bytes of parameters, gradients, optimizer states, total."""
    rows = []
    for stage in memory.ZERO_STAGES:
        b = memory.model_state_bytes(n_params, recipe=recipe, zero_stage=stage, dp=dp, tp=tp, pp=pp)
        rows.append(
            {
                "zero_stage": stage,
                "parameters": b.parameters,
                "gradients": b.gradients,
                "optimizer_states": b.optimizer_states,
                "total": b.total,
            }
        )
    return rows


def deepspeed_memory_table(
    n_params: float, *, dp: int = 1, tp: int = 1, pp: int = 1, largest_layer_params: float = 0.0
) -> list[dict]:
    """One row per ZeRO stage DeepSpeed's estimator covers (2, 3): its bytes per GPU."""
    psi = n_params / (tp * pp)
    rows = []
    for stage in (2, 3):
        e = memory.deepspeed_estimate(
            psi, zero_stage=stage, dp=dp, largest_layer_params=largest_layer_params / (tp * pp)
        )
        rows.append(
            {
                "zero_stage": stage,
                "replicated": e.replicated,
                "sharded": e.sharded,
                "fp32_gradients": e.fp32_gradients,
                "total": e.total,
                "printed_gb": e.printed_gb,
            }
        )
    return rows


def _deepspeed_main(args, n_params: float) -> int:
    layer = model_preset(args.model).largest_layer_params if args.model else 0.0
    rows = deepspeed_memory_table(
        n_params, dp=args.dp, tp=args.tp, pp=args.pp, largest_layer_params=layer
    )
    if args.json:
        print(
            json.dumps(
                {
                    "n_params": n_params,
                    "convention": "deepspeed",
                    "dp": args.dp,
                    "tp": args.tp,
                    "pp": args.pp,
                    "largest_layer_params": layer,
                    "rows": rows,
                },
                indent=1,
            )
        )
        return 0
    table = [
        [f"{r['zero_stage']}"]
        + [f"{r[k] / GB:.2f}" for k in ("replicated", "sharded", "fp32_gradients", "total")]
        + [f"{r['printed_gb']:.2f}"]
        for r in rows
    ]
    _print_table(
        f"Model states per GPU as DeepSpeed's estimator counts them: {n_params:.3g} parameters, "
        f"dp={args.dp} tp={args.tp} pp={args.pp}",
        [
            "ZeRO stage",
            "whole GB",
            "sharded GB",
            "of it fp32 grads GB",
            "total GB",
            "DeepSpeed prints 'GB'",
        ],
        table,
        [
            (
                "ZeRO-2: 4Ψ + 16Ψ/N; ZeRO-3: 4L + 18Ψ/N (L: largest layer, from --model, else 0); "
                "mixed-precision Adam, no offload."
            ),
            "GB = 1e9 bytes; DeepSpeed's printed 'GB' is bytes / 2^30 (a GiB).",
        ],
    )
    return 0


def _memory_main(args) -> int:
    n_params = args.params if args.params is not None else model_preset(args.model).n_params
    if args.convention == "deepspeed":
        return _deepspeed_main(args, n_params)
    rows = memory_table(n_params, recipe=args.recipe, dp=args.dp, tp=args.tp, pp=args.pp)
    if args.json:
        print(
            json.dumps(
                {
                    "n_params": n_params,
                    "recipe": args.recipe,
                    "dp": args.dp,
                    "tp": args.tp,
                    "pp": args.pp,
                    "rows": rows,
                },
                indent=1,
            )
        )
        return 0
    names = {0: "0 (plain DP)", 1: "1 (P_os)", 2: "2 (P_os+g)", 3: "3 (P_os+g+p)"}
    table = [
        [names[r["zero_stage"]]]
        + [f"{r[k] / GB:.2f}" for k in ("parameters", "gradients", "optimizer_states", "total")]
        + [f"{r['total'] / GiB:.2f}"]
        for r in rows
    ]
    rec = memory.get_recipe(args.recipe)
    _print_table(
        f"Model states per GPU: {n_params:.3g} parameters, {args.recipe}, "
        f"dp={args.dp} tp={args.tp} pp={args.pp}",
        ["ZeRO stage", "params GB", "grads GB", "optimizer GB", "total GB", "total GiB"],
        table,
        [f"{rec.description}.", "GB = 1e9 bytes (the ZeRO paper's unit), GiB = 2^30 bytes."],
    )
    return 0


# -- distlab bubble -------------------------------------------------------------


def _register_bubble(subparsers) -> None:
    p = subparsers.add_parser(
        "bubble",
        help="pipeline bubble of GPipe, 1F1B and interleaved (Narayanan et al. 2021, Section 2.2)",
    )
    p.add_argument("--stages", type=COUNT, required=True, help="pipeline stages p")
    p.add_argument("--micro-batches", type=COUNT, required=True, help="micro-batches m per step")
    p.add_argument("--virtual-stages", type=COUNT, default=2, help="chunks per rank (interleaved)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_bubble_main)


#: the largest schedule ``distlab bubble`` replays for its "replayed" column: at most this many
#: stages and slots (stages x micro-batches x chunks), about a second of replay each (a replay's
#: time grows with both); the closed forms take any size
REPLAY_STAGES = 64
REPLAY_SLOTS = 8_192


def bubble_table(stages: int, micro_batches: int, *, virtual_stages: int = 2) -> list[dict]:
    """One row per schedule: bubble fractions and in-flight micro-batches (closed forms, any
    size), and the bubble counted by replaying the schedule: None where the schedule cannot
    be built (interleaved needs m to be a multiple of p) or is larger than
    :data:`REPLAY_STAGES` stages or :data:`REPLAY_SLOTS` slots, so that the work stays
    bounded however large p and m are."""
    rows = []
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", virtual_stages)):
        kw = {"schedule": schedule, "virtual_stages": v}
        row = {
            "schedule": schedule,
            "virtual_stages": v,
            "bubble_of_total": pipeline.bubble_fraction(stages, micro_batches, **kw),
            "bubble_over_ideal": pipeline.bubble_fraction(
                stages, micro_batches, relative_to="ideal", **kw
            ),
            "in_flight_micro_batches": pipeline.in_flight_micro_batches(
                stages, micro_batches, **kw
            ),
            "bubble_counted_from_schedule": None,
        }
        if stages <= REPLAY_STAGES and stages * micro_batches * v <= REPLAY_SLOTS:
            try:
                replayed = pipeline.replay(pipeline.schedule_ops(stages, micro_batches, **kw))
                row["bubble_counted_from_schedule"] = replayed.bubble_fraction
            except ValueError:  # interleaved needs m to be a multiple of p
                pass
        rows.append(row)
    return rows


def _bubble_main(args) -> int:
    rows = bubble_table(args.stages, args.micro_batches, virtual_stages=args.virtual_stages)
    if args.json:
        print(
            json.dumps(
                {"stages": args.stages, "micro_batches": args.micro_batches, "rows": rows}, indent=1
            )
        )
        return 0
    table = [
        [
            r["schedule"]
            + (f" (v={r['virtual_stages']})" if r["schedule"] == "interleaved" else ""),
            f"{r['bubble_of_total']:.2%}",
            f"{r['bubble_over_ideal']:.2%}",
            f"{r['in_flight_micro_batches']:g}",
            "-"
            if r["bubble_counted_from_schedule"] is None
            else f"{r['bubble_counted_from_schedule']:.2%}",
        ]
        for r in rows
    ]
    _print_table(
        f"Pipeline bubble: p={args.stages} stages, m={args.micro_batches} micro-batches",
        ["schedule", "bubble / step", "bubble / ideal", "in flight (stage 0)", "replayed"],
        table,
        [
            (
                "bubble / step = (p-1)/(vm+p-1); bubble / ideal = (p-1)/(vm) "
                "(Narayanan et al. 2021, Section 2.2)."
            ),
            (
                "replayed: idle share counted by timing the schedule's ops (backward = 2 x "
                f"forward); '-' where it cannot be built, or has more than {REPLAY_STAGES} "
                f"stages or {REPLAY_SLOTS:,} slots (stages x micro-batches x chunks)."
            ),
        ],
    )
    return 0


# -- distlab plan -----------------------------------------------------------------


def _register_plan(subparsers) -> None:

    p = subparsers.add_parser(
        "plan", help="rank 3D-parallel layouts (TP, PP, DP, ZeRO, micro-batches, recompute)"
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", type=_preset, help=f"a model preset: {', '.join(MODEL_PRESETS)}")
    what.add_argument("--params", type=cli(positive), help="parameters only: a GPT shape is chosen")
    what.add_argument("--layers", type=COUNT, help="custom shape: also --hidden, --heads")
    p.add_argument("--hidden", type=COUNT, help="hidden size of a custom shape (with --layers)")
    p.add_argument("--heads", type=COUNT, help="attention heads of a custom shape (with --layers)")
    p.add_argument(
        "--vocab", type=COUNT, default=None, help="vocabulary (default 50257; not with --model)"
    )
    p.add_argument("--seq-len", type=COUNT, default=None, help="sequence length (default: model's)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", help=f"a cluster preset: {', '.join(PRESETS)}")
    where.add_argument("--cluster-file", help="a cluster spec in JSON or YAML")
    p.add_argument("--nodes", type=COUNT, default=None, help="number of nodes (default: preset's)")
    p.add_argument("--global-batch", type=COUNT, required=True, help="sequences per step")
    p.add_argument("--top", type=COUNT, default=10, help="layouts to show")
    p.add_argument(
        "--compute-efficiency",
        type=cli(above_zero_fraction),
        default=0.5,
        help="fraction of peak FLOP/s the matmuls reach (default 0.5)",
    )
    p.add_argument(
        "--dp-overlap",
        type=cli(fraction),
        default=0.0,
        help="fraction of DP/ZeRO communication hidden behind compute (default 0)",
    )
    p.add_argument(
        "--headroom",
        type=cli(below_one),
        default=0.1,
        help="fraction of GPU memory kept free (default 0.1)",
    )
    p.add_argument("--recipe", default="mixed_adam", help=f"one of {', '.join(memory.RECIPES)}")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_plan_main)


def _model_from_args(args) -> ModelSpec:
    shape = {"--hidden": args.hidden, "--heads": args.heads}
    if args.layers is None:  # a value that would be ignored is refused instead
        given = {**shape, "--vocab": args.vocab} if args.model is not None else shape
        for option, value in given.items():
            if value is not None:
                chosen = "--model" if args.model is not None else "--params"
                raise ValueError(
                    f"{option} {value} is not used with {chosen}; give it with --layers"
                )
    vocab = 50257 if args.vocab is None else args.vocab
    if args.model is not None:
        spec = model_preset(args.model)
    elif args.params is not None:
        spec = gpt_shape_for(args.params, seq_len=args.seq_len or 2048, vocab=vocab)
    else:
        missing = [option for option, value in shape.items() if value is None]
        if missing:
            raise ValueError(
                f"a custom model needs --layers, --hidden and --heads: {missing} missing"
            )
        spec = ModelSpec(
            "custom",
            args.layers,
            args.hidden,
            args.heads,
            vocab=vocab,
            seq_len=args.seq_len or 2048,
        )
    if args.seq_len is not None and args.seq_len != spec.seq_len:
        from dataclasses import replace

        spec = replace(spec, seq_len=args.seq_len)
    return spec


def _schedule_name(layout) -> str:
    if layout.pp == 1:
        return "-"
    if layout.virtual_stages > 1:
        return f"{layout.pipeline_schedule} v={layout.virtual_stages}"
    return layout.pipeline_schedule


def _plan_main(args) -> int:

    spec = _model_from_args(args)
    if args.cluster is not None:
        cluster = preset(args.cluster, nodes=args.nodes)
    else:
        cluster = load_cluster(args.cluster_file)
        if args.nodes is not None:
            cluster = cluster.with_nodes(args.nodes)
    assumptions = PlannerAssumptions(
        compute_efficiency=args.compute_efficiency,
        dp_overlap=args.dp_overlap,
        memory_headroom=args.headroom,
        recipe=args.recipe,
    )
    result = plan(spec, cluster, global_batch=args.global_batch, assumptions=assumptions)
    if args.json:
        print(json.dumps(result.to_dict(top=args.top), indent=1))
        return 0
    try:
        _ = result.best  # raises a clear ValueError when nothing fits
    except ValueError as exc:
        if args.params is None:
            raise
        raise ValueError(f"{exc} (--params {args.params:g})") from None  # the name rounds it
    rows = [
        [
            str(i + 1),
            f"{e.layout.tp}/{e.layout.pp}/{e.layout.dp}",
            str(e.layout.zero_stage),
            f"{e.layout.micro_batch} x {e.layout.micro_batches}",
            e.layout.recompute,
            _schedule_name(e.layout),
            f"{e.memory.total / GB:.1f}",
            f"{e.bubble_fraction:.1%}",
            format_seconds(e.tp_comm_s + e.pp_comm_s + e.dp_comm_s),
            format_seconds(e.step_s),
            f"{e.mfu:.1%}",
        ]
        for i, e in enumerate(result.candidates[: args.top])
    ]
    _print_table(
        f"Layouts for {spec.name} on {cluster.world_size} GPUs ({cluster.name}), "
        f"global batch {args.global_batch}",
        [
            "#",
            "TP/PP/DP",
            "ZeRO",
            "b x m",
            "recompute",
            "schedule",
            "GB/GPU",
            "bubble",
            "comm",
            "step",
            "MFU",
        ],
        rows,
        result.explain(),
    )
    return 0


def standalone_parser() -> argparse.ArgumentParser:
    """A ``distlab`` parser with only these three subcommands (used by the tests)."""
    parser = argparse.ArgumentParser(prog="distlab")
    register(parser.add_subparsers(dest="command", required=True))
    return parser
