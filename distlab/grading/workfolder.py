"""A learner's work folder, outside the course checkout (``distlab course start DIR [NN ...]``).

A learner who fills in the notebooks of ``course/`` inside a clone of the repository edits
files that ``git pull`` then wants to replace: the pull stops, or conflicts. :func:`start`
copies each released notebook's folder (the notebook and the files beside it) to
``DIR/NN-topic/``, where ``distlab grade NN`` run in ``DIR`` finds it
(:mod:`distlab.grading.resolve`) and ``distlab course upgrade`` later carries the work into a
newer release (:mod:`distlab.grading.upgrade`). It never overwrites a learner's file: if any
file it would write exists, it writes nothing and names them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from distlab.core.course import (
    RELEASE_DIR,
    assignment_names,
    assignments_named,
    find_course_root,
)

LEFT_OUT = (".ipynb_checkpoints", "__pycache__")


def chosen_assignments(names: list[str] | None, root: Path) -> list[str]:
    """The assignments ``names`` stand for (``08``, ``08-pipeline-parallelism``); all of them
    for none. ValueError names a name that fits none, and the choices."""
    if not names:
        return assignment_names(root)
    chosen = []
    for name in names:
        found = assignments_named(name, root)
        if not found:
            known = ", ".join(assignment_names(root))
            raise ValueError(f"no course notebook is called {name!r}; the notebooks are {known}")
        chosen += [a for a in found if a not in chosen]
    return chosen


def _files(folder: Path) -> list[Path]:
    """The files of a released assignment's folder, without editor and Python caches."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part in LEFT_OUT for part in p.relative_to(folder).parts)
    )


def start(folder: str | os.PathLike, names: list[str] | None = None, root=None) -> list[Path]:
    """Copy the released notebooks ``names`` (default: every one) with the files beside them
    into ``folder/NN-topic/``; return the notebooks written. Writes nothing, and raises
    ValueError naming them, if any of those files exists already."""
    source_root = find_course_root(root)
    target = Path(folder).expanduser()
    if target.exists() and not target.is_dir():
        raise ValueError(f"{target} is a file, not a folder to start the course in")
    copies = []
    for assignment in chosen_assignments(names, source_root):
        released = source_root / RELEASE_DIR / assignment
        files = _files(released) if released.is_dir() else []
        if not any(p.suffix == ".ipynb" for p in files):
            raise ValueError(
                f"the course in {source_root} has no released notebook in {released}; an "
                f"instructor makes it with `nbgrader generate_assignment {assignment}`"
            )
        copies += [(p, target / assignment / p.relative_to(released)) for p in files]
    existing = [str(to) for _, to in copies if to.exists()]
    if existing:
        raise ValueError(
            f"not overwriting your work: {', '.join(existing)} "
            f"{'exists' if len(existing) == 1 else 'exist'} already, and nothing was "
            "copied. Start other notebooks by number (`distlab course start DIR 09`), or carry "
            "a copy from an older release into the current one (`distlab course upgrade FILE`)"
        )
    for source, to in copies:
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, to)
    return [to.resolve() for _, to in copies if to.suffix == ".ipynb"]
