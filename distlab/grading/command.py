"""``distlab grade NOTEBOOK [--exercise K]``: autograde a course notebook on your own machine.

The whole notebook is graded by nbgrader in a throw-away course directory
(:mod:`distlab.grading.whole`); ``--exercise K`` runs only the cells one exercise needs
(:mod:`distlab.grading.exercise`). Ctrl+C, SIGTERM and SIGHUP end every process the
grading started before the command exits (:mod:`distlab.grading.run`). Each exercise's
points are recorded in the learner's data folder for ``distlab progress``
(:mod:`distlab.grading.record`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from distlab.core.course import ROOT_ENV_VAR
from distlab.grading.exercise import grade_exercise
from distlab.grading.record import GRADED, record_quietly
from distlab.grading.report import as_json, format_report
from distlab.grading.run import Interrupted, signals_raise
from distlab.grading.whole import grade_notebook

TIMEOUT_ENV_VAR = "DISTLAB_GRADE_TIMEOUT"  # seconds a cell may run while grading


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "grade",
        help="autograde a course notebook (points per exercise, failing tests, what to review)",
        description=(
            "Autograde one notebook of the distlab course in a temporary nbgrader course "
            "directory: hidden tests included, edited test cells restored."
        ),
    )
    parser.add_argument(
        "notebook",
        help="your notebook: a path (course/00-launching/00-launching.ipynb, also from inside "
        "course/), or a course notebook's name (00-launching, or 00)",
    )
    parser.add_argument(
        "--exercise",
        metavar="K",
        help="grade one exercise only, running just the cells it needs (seconds, not minutes): "
        "its number (1, 2, ...), its test cell's id, or the start of its title",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--course-root", help=f"the course checkout (default: ${ROOT_ENV_VAR} or this package's)"
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="write your graded copy to DIR: the notebook as it ran, with every test's "
        "result (the hidden tests' code left out)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=os.environ.get(TIMEOUT_ENV_VAR),
        metavar="SECONDS",
        help=f"stop a cell that runs longer and report it as timed out (default: "
        f"${TIMEOUT_ENV_VAR}, else the course's Execute.timeout)",
    )
    parser.set_defaults(func=_main)


def _seconds(text: str) -> int:
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds >= 1")
    return seconds


def _main(args: argparse.Namespace) -> int:
    try:
        with signals_raise():
            if args.exercise is not None:
                grade = grade_exercise(args.notebook, args.exercise, args.course_root, args.timeout)
            else:
                grade = grade_notebook(
                    args.notebook, args.course_root, args.keep, not args.json, args.timeout
                )
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    except Interrupted as stop:
        print(
            f"distlab grade: stopped by {stop}; every process it started has ended and its "
            "temporary folders are removed",
            file=sys.stderr,
        )
        return stop.exit_code
    problem = record_quietly(grade, GRADED, "exercise" if args.exercise is not None else "notebook")
    if problem:
        print(f"distlab grade: {problem}", file=sys.stderr)
    print(json.dumps(as_json(grade), indent=2) if args.json else format_report(grade))
    return 0 if grade.points >= grade.max_points else 1
