"""Which file ``distlab grade NAME`` grades, and which course notebook it is.

A learner works on a copy (``~/work/02-collectives.ipynb``) more often than on the
released file in ``course/``, so a name or a path is resolved against the current
folder first, and the course's own copy is graded only when the current folder holds
none:

1. a path to a file: that file;
2. a path to a folder: the one course notebook in it;
3. a course notebook's name (``02-collectives``, ``02``, ``02-collectives.ipynb``,
   ``02-collectives/``): its notebooks in the current folder (``*.ipynb`` here, and in a
   folder named after the assignment), recognised by their graded cells;
4. the same path relative to the course checkout (``course/02-collectives/...``), then the
   released notebook of the named assignment in ``course/``.

The first step that finds something decides. Where it finds several notebooks, nothing is
graded: the error lists them. A notebook is recognised by the grade ids of its test cells,
so a renamed copy is still graded as the notebook it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from distlab.core.course import (
    assignment_names,
    assignments_named,
    find_course_root,
    released_notebook,
    source_notebooks,
)
from distlab.grading.cells import grade_id_of, is_graded


@dataclass(frozen=True)
class Resolved:
    """The notebook to grade: its absolute path and the course notebook it matched."""

    path: Path
    assignment: str
    notebook: str
    note: str | None = None  # said in the report when the file is not from the current folder


@lru_cache(maxsize=4)
def _course_test_ids(source_root: Path) -> dict[tuple[str, str], frozenset[str]]:
    """(assignment, notebook) -> the grade ids of its graded test cells."""
    import nbformat

    ids = {}
    for assignment in assignment_names(source_root):
        for source in source_notebooks(source_root, assignment):
            nb = nbformat.read(source, as_version=4)
            ids[assignment, source.stem] = frozenset(
                grade_id_of(c) for c in nb.cells if is_graded(c)
            )
    return ids


def _read_test_ids(path: Path) -> set[str]:
    import nbformat

    if path.suffix != ".ipynb":
        raise ValueError(f"{path} is not a notebook (expected a .ipynb file)")
    try:
        learner = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a notebook"
        raise ValueError(f"{path} could not be read as a Jupyter notebook: {exc}") from None
    return {grade_id_of(c) for c in learner.cells if is_graded(c)}


def identify(notebook_path: str | os.PathLike, root: str | None = None) -> tuple[str, str]:
    """(assignment, notebook name) of a learner's notebook, matched by its graded cells' ids."""
    path = Path(notebook_path)
    if not path.is_file():
        raise FileNotFoundError(f"no such notebook: {path}")
    ids = _read_test_ids(path)
    source_root = find_course_root(root)
    matches = [
        (len(graded & ids), assignment, name)
        for (assignment, name), graded in _course_test_ids(source_root).items()
        if graded & ids
    ]
    if not matches:
        known = ", ".join(assignment_names(source_root))
        raise ValueError(
            f"{path} is not part of the distlab course: none of its cells is a graded test "
            f"cell of the course notebooks ({known}). Grade a notebook from course/."
        )
    _, assignment, name = max(matches)
    return assignment, name


def _course_notebooks_in(folder: Path, root: Path, assignments: list[str] | None) -> list[Path]:
    """The notebooks directly in ``folder`` that are course notebooks (of ``assignments``)."""
    found = []
    for path in sorted(folder.glob("*.ipynb")):
        try:
            assignment, _ = identify(path, root)
        except ValueError:
            continue  # not a course notebook, or not a notebook at all
        if assignments is None or assignment in assignments:
            found.append(path)
    return found


def _one(found: list[Path], given: str, where: Path, root: Path, note: str | None = None):
    if len(found) > 1:
        listed = "\n".join(f"  {p.resolve()}" for p in found)
        raise ValueError(
            f"{given!r} fits {len(found)} notebooks in {where.resolve()}:\n{listed}\n"
            "Nothing was graded: give the path of the one to grade."
        )
    path = found[0].resolve()
    assignment, notebook = identify(path, root)
    return Resolved(path, assignment, notebook, note)


def resolve_notebook(
    notebook: str | os.PathLike, root: str | os.PathLike | None = None, cwd: Path | None = None
) -> Resolved:
    """The notebook that ``notebook`` names, from ``cwd`` (default: the current folder)."""
    here = Path.cwd() if cwd is None else Path(cwd)
    given = Path(notebook).expanduser()
    source_root = find_course_root(root)
    path = given if given.is_absolute() else here / given
    if path.is_file():
        return _one([path], str(notebook), path.parent, source_root)
    if path.is_dir():
        found = _course_notebooks_in(path, source_root, None)
        if found:
            return _one(found, str(notebook), path, source_root)
    named = assignments_named(given.name, source_root)
    if named and len(given.parts) == 1:
        found = _course_notebooks_in(here, source_root, named)
        for assignment in named:
            if (here / assignment).is_dir():
                found += _course_notebooks_in(here / assignment, source_root, named)
        if found:
            return _one(found, str(notebook), here, source_root)
    return _in_the_course(notebook, given, named, source_root, here)


def find_notebook(notebook: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The learner's notebook that ``notebook`` names (a path or a course notebook's name),
    looked for in the current folder first (see the module's docstring)."""
    return resolve_notebook(notebook, root).path


def _in_the_course(notebook, given: Path, named: list[str], root: Path, here: Path) -> Resolved:
    """Step 4: a path relative to the course checkout, or the released notebook of a name."""
    candidates = [] if given.is_absolute() else [root / given]
    if len(given.parts) == 1:
        candidates += [released_notebook(root, a) for a in named]
    tried = [str(here / given)]
    for candidate in candidates:
        if candidate.is_dir():  # an assignment folder: its notebook of the same name
            candidate = candidate / f"{candidate.name}.ipynb"
        if candidate.is_file():
            note = f"no copy of it in {here}: graded the course's own file"
            return _one([candidate], str(notebook), candidate.parent, root, note)
        tried.append(str(candidate))
    known = ", ".join(assignment_names(root))
    raise FileNotFoundError(
        f"no such notebook: {notebook} (tried {', '.join(dict.fromkeys(tried))}). Give a path "
        f"to your notebook, or the name of a course notebook: {known}"
    )
