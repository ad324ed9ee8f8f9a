"""``distlab course start DIR [NN ...]`` and ``distlab course upgrade FILE``: the learner's
own copies of the course.

* ``start``: a work folder with copies of the released notebooks (and the files beside them),
  so that the learner does not edit ``course/`` inside a clone, which ``git pull`` would then
  refuse or conflict with (:mod:`distlab.grading.workfolder`);
* ``upgrade``: a copy from an older release carried into the current one, solutions by grade
  id, with a backup of the file and a list of what could not be carried
  (:mod:`distlab.grading.upgrade`).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from distlab.core.course import ROOT_ENV_VAR
from distlab.grading.upgrade import upgrade
from distlab.grading.workfolder import start


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "course",
        help="your own copies of the course: start a work folder, upgrade a copy",
        description="Your own copies of the course notebooks, outside the course's checkout.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    begin = actions.add_parser(
        "start",
        help="copy the released notebooks into a work folder of your own",
        description=(
            "Copy the released notebooks (all, or those named) with the files beside them "
            "into DIR/NN-topic/. Work and grade there (`distlab grade NN` from DIR): a clone's "
            "course/ stays as released, so `git pull` updates it. Existing files are never "
            "overwritten."
        ),
    )
    begin.add_argument("folder", metavar="DIR", help="the work folder (created if missing)")
    begin.add_argument(
        "notebooks", nargs="*", metavar="NN", help="notebooks to copy: 08 or 08-pipeline-parallelism "
        "(default: all)",
    )  # fmt: skip
    begin.set_defaults(func=_start)
    move = actions.add_parser(
        "upgrade",
        help="carry your work in a copy from an older release into the current release",
        description=(
            "Put your solution cells (matched by grade id) and the cells you added into the "
            "current release of the notebook, in place. Your file is kept in backups/ beside "
            "it; what could not be carried is listed."
        ),
    )
    move.add_argument("files", nargs="+", metavar="FILE", help="your notebook(s) to upgrade")
    for sub in (begin, move):
        sub.add_argument(
            "--course-root",
            help=f"the course checkout (default: ${ROOT_ENV_VAR}, the current folder or its "
            "parents, or this package's)",
        )
    move.set_defaults(func=_upgrade)


def _start(args: argparse.Namespace) -> int:
    written = _no_missing_file(start, args.folder, args.notebooks, args.course_root)
    folder = Path(args.folder).expanduser().resolve()
    print(f"started your work folder {folder}:")
    print("\n".join(f"  {path.relative_to(folder)}" for path in written))
    where = shlex.quote(str(folder))
    first = written[0].parent.name.split("-", 1)[0]
    print(f"open it with `jupyter lab {where}`; grade from there with `cd {where} && distlab "
          f"grade {first}`")  # fmt: skip
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    for path in args.files:
        print(_no_missing_file(upgrade, path, args.course_root).report())
    return 0


def _no_missing_file(action, *args):
    """``action(*args)``, a missing file or course reported as bad input (one line, exit 2)."""
    try:
        return action(*args)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
