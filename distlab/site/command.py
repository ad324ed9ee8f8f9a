"""``distlab site build``: the command that builds the course site (:mod:`distlab.site.build`)."""

from __future__ import annotations

import argparse
import sys

from distlab.site.build import build


def register(subparsers) -> None:
    """Add ``distlab site build`` to the ``distlab`` command."""
    site = subparsers.add_parser(
        "site",
        help="build the course website (static pages, offline)",
        description="The course as static pages: every notebook as released with the outputs "
        "of a real run, the flashcards, the library's docstrings, search.",
    )
    actions = site.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    build = actions.add_parser(
        "build",
        help="build the site into build/site/html",
        description="Build the site into OUT/html (default build/site/html of the course "
        "checkout). Notebook outputs come from the last test run or build where they ran "
        "today's notebooks; the other notebooks run now (about a minute each).",
    )
    build.add_argument("--out", metavar="DIR", help="output folder (default: build/site)")
    build.add_argument(
        "--executed",
        metavar="DIR",
        action="append",
        help="a folder of executed notebooks to reuse, besides the build's own (default: "
        "the test run's, .pytest_cache/d/executed-notebooks); repeat for several",
    )
    build.add_argument(
        "--no-execute",
        action="store_true",
        help="fail instead of running a notebook that no folder holds (CI: the tests ran them)",
    )
    build.add_argument(
        "--fresh", action="store_true", help="run every notebook again, reusing nothing"
    )
    build.add_argument("--course-root", metavar="DIR", help="the course checkout to build")
    build.add_argument(
        "--jobs", default="auto", metavar="N", help="Sphinx worker processes (default: auto)"
    )
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    """Build, print the report; a failure is one line on stderr and exit status 1."""
    try:
        report = build(
            args.out,
            root=args.course_root,
            executed_folders=args.executed,
            run_missing=not args.no_execute,
            fresh=args.fresh,
            jobs=args.jobs,
        )
    except (RuntimeError, FileNotFoundError) as failed:
        print(f"distlab site build: error: {failed}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """A parser with only the ``site`` command (``python -m distlab.site``)."""
    parser = argparse.ArgumentParser(prog="python -m distlab")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m distlab.site build ...``: the same as ``distlab site build ...``."""
    args = build_parser().parse_args(["site", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


__all__ = ["build_parser", "main", "register", "run_build"]
