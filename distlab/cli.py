"""The ``distlab`` command: one subcommand per tool.

Each tool module exposes ``register(subparsers)`` which adds its subcommand
and sets ``func`` on the parsed arguments; this file only wires them up.
"""

from __future__ import annotations

import argparse
import sys

from distlab import grading, site
from distlab.commands import bench, calc, course, placement, progress, sim

# each registers these subcommands
COMMAND_MODULES = [
    bench,  # distlab bench
    sim,  # distlab sim
    placement,  # distlab place, distlab schedule
    calc,  # distlab memory, distlab bubble, distlab plan
    grading,  # distlab grade
    progress,  # distlab progress
    course,  # distlab course start, distlab course upgrade
    site,  # distlab site build
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distlab",
        description="distlab: distributed training you can run, measure and simulate on a laptop.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)
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
