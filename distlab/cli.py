"""The ``distlab`` command: one subcommand per tool.

Each tool module exposes ``register(subparsers)`` which adds its subcommand
and sets ``func`` on the parsed arguments; this file only wires them up.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module path -> registers these subcommands
COMMAND_MODULES = [
    "distlab.collectives.bench",  # distlab bench
    "distlab.sim.commands",  # distlab sim
    "distlab.placement.commands",  # distlab place, distlab schedule
    "distlab.calc.commands",  # distlab memory, distlab bubble, distlab plan
    "distlab.grading",  # distlab grade
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distlab",
        description="distlab: distributed training you can run, measure and simulate on a laptop.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"distlab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
