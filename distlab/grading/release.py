"""Which release of the course a notebook came from, and what changed in its exercises since.

A *release* of a notebook is what ``nbgrader generate_assignment`` writes into ``course/``.
:func:`stamp_release` runs as its last step (``nbgrader_config.py``) and records, in the
notebook's metadata under ``distlab.release``:

* ``id``: a digest of the notebook as released (each cell's id, type, source and points). It
  says whether a copy is the current release: it changes when the course's text, a demo or an
  exercise changes, and only then;
* ``cells``: the ids of the released cells, so that the cells a learner added to a copy are
  told apart from the course's own (:mod:`distlab.grading.upgrade` carries them over);
* ``version``: distlab's version when the notebook was released, for people to read.

Why not the version alone: notebooks change between versions, and a version says nothing about
which cells changed. Why not a git commit: an installed package has none, and the release that
``distlab grade`` makes in a throw-away course directory must equal the one in ``course/``. The
id depends only on what the learner received.

Whether an *exercise* changed is decided cell by cell (an exercise is its test cell and the
solution and read-only cells between it and the previous test cell). A solution cell, from
nbgrader's own checksum: nbgrader stores in every cell it releases the checksum of that cell as
released (``metadata.nbgrader.checksum``: source, type, grade id, points), and a learner edits
a solution cell's source, not its metadata, so a copy keeps the checksum of the stub it was
given, even a copy made before releases were recorded. A test or read-only cell, which the
learner does not edit, by its code and points: imports and blank lines aside, so that a test
that now imports what it uses is not reported as changed.

Pure Python on notebooks as dicts (an ``nbformat`` node is one): no nbgrader.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from importlib import metadata

from distlab.grading.cells import grade_id_of, is_graded, is_solution

RELEASE_KEY = "release"  # under the notebook's metadata.distlab
#: the lines nbgrader puts where a solution was (``ClearSolutions.code_stub`` in
#: nbgrader_config.py): a learner replaces them, so they are not "given" code
STUB_LINES = ("# YOUR CODE HERE", "raise NotImplementedError()")


def _version() -> str:
    try:
        return metadata.version("distlab")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _points(cell) -> float | None:
    points = _nbgrader(cell).get("points")
    return None if points is None else float(points)


def stamp(nb) -> dict:
    """The release record of ``nb`` as it is now (see the module's docstring)."""
    cells = [(c.get("id"), c.get("cell_type"), c.get("source"), _points(c)) for c in nb["cells"]]
    digest = hashlib.sha256(json.dumps(cells).encode("utf-8")).hexdigest()[:12]
    return {"id": digest, "version": _version(), "cells": [c.get("id") for c in nb["cells"]]}


def stamp_release(nb, resources):
    """nbconvert preprocessor (a plain function, as nbconvert allows): record the release in
    ``nb``'s metadata. ``nbgrader_config.py`` makes it the last step of
    ``generate_assignment``, after the checksums."""
    nb.metadata.setdefault("distlab", {})[RELEASE_KEY] = stamp(nb)
    return nb, resources


def release_of(nb) -> dict | None:
    """The release record a notebook carries, or None (a copy made before releases were
    recorded, or a notebook that was never released)."""
    found = nb.get("metadata", {}).get("distlab", {}).get(RELEASE_KEY)
    return found if isinstance(found, dict) and found.get("id") else None


def describe_release(record: dict | None) -> str:
    """``distlab 0.1.0, release 3f2a9c0d1e2b`` (or what to say when there is no record)."""
    if record is None:
        return "a copy made before releases were recorded"
    return f"distlab {record.get('version', '?')}, release {record['id']}"


# ------------------------------------------------------------------ exercises ---
@dataclass(frozen=True)
class Exercise:
    """One exercise of a notebook: its test cell and the cells that belong to it."""

    title: str
    test_id: str
    cell_ids: tuple[str, ...]  # grade ids: solution and read-only cells, then the test cell


def exercises(nb) -> list[Exercise]:
    """The notebook's exercises, in order: each test cell with the solution and read-only
    cells (those with a grade id) since the previous test cell."""
    found, pending = [], []
    for cell in nb["cells"]:
        grade_id = grade_id_of(cell)
        if grade_id is None:
            continue
        pending.append(grade_id)
        if is_graded(cell):
            title = cell.get("metadata", {}).get("distlab", {}).get("exercise", grade_id)
            found.append(Exercise(title, grade_id, tuple(pending)))
            pending = []
    return found


@dataclass(frozen=True)
class Change:
    """What changed in one exercise, in one line."""

    exercise: str  # its title
    what: str
    test_id: str = ""  # its test cell's grade id

    @property
    def line(self) -> str:
        return f"{self.exercise}: {self.what}"


@dataclass
class Comparison:
    """A copy against the current release of its notebook."""

    copy: dict | None  # the copy's release record
    now: dict | None  # the current release's record
    changes: list[Change] = field(default_factory=list)

    @property
    def current(self) -> bool:
        """Whether the copy is the current release: the same release id. A copy made before
        releases were recorded is not known to be (its demo cells may be older than its
        exercises); against a release that records none, the same exercises count."""
        if self.now is None:
            return not self.changes
        return self.copy is not None and self.copy["id"] == self.now["id"]


def compare(copy, released) -> Comparison:
    """How the learner's ``copy`` stands against ``released``, the current release of its
    notebook: its release, and one :class:`Change` per exercise that changed, was added or
    was removed since the copy's release."""
    mine = {grade_id_of(c): c for c in copy["cells"] if grade_id_of(c)}
    now = {grade_id_of(c): c for c in released["cells"] if grade_id_of(c)}
    changes = []
    for exercise in exercises(released):
        if exercise.test_id not in mine:
            new = "new in this release: your copy does not have it"
            changes.append(Change(exercise.title, new, exercise.test_id))
            continue
        parts = [_cell_change(mine.get(g), now[g]) for g in exercise.cell_ids]
        parts = [p for p in parts if p]
        if parts:
            changes.append(Change(exercise.title, "; ".join(parts), exercise.test_id))
    for exercise in exercises(copy):
        if exercise.test_id not in now:
            gone = "no longer in the course, so not graded"
            changes.append(Change(exercise.title, gone, exercise.test_id))
    return Comparison(release_of(copy), release_of(released), changes)


def _cell_change(mine, now) -> str | None:
    """What changed in one exercise cell, or None. A solution cell changed when its checksum
    (that of the stub as released) differs; a test or read-only cell, which the learner does
    not edit, when its points or its code differ, imports and blank lines aside (a test that
    now imports what it uses tests the same)."""
    grade_id = grade_id_of(now)
    if mine is None:
        kind = "cell to fill in" if is_solution(now) else "read-only cell"
        return f"a new {kind} ({grade_id})"
    if is_solution(now):
        old_sum, new_sum = _nbgrader(mine).get("checksum"), _nbgrader(now).get("checksum")
        if not old_sum or not new_sum or old_sum == new_sum:
            return None  # no checksum: a learner's solution cannot be told from a changed stub
        return _solution_change(mine.get("source", ""), now.get("source", ""))
    if is_graded(now) and _points(mine) != _points(now):
        return f"its points changed from {_points(mine):g} to {_points(now):g}"
    old, new = _code(mine.get("source", "")), _code(now.get("source", ""))
    if old == new:
        return None
    what = "its test" if is_graded(now) else f"its read-only cell {grade_id}"
    return f"{what} changed: {first_difference(old, new)}"


def _code(source: str) -> str:
    """``source`` without its top-level import statements and blank lines."""
    lines = source.splitlines()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "\n".join(line for line in lines if line.strip())
    imports = {
        number
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for number in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }
    return "\n".join(line for n, line in enumerate(lines, 1) if line.strip() and n not in imports)


def checksum(cell) -> str:
    """nbgrader's checksum of a cell (``nbgrader.utils.compute_checksum``, written out here
    because importing nbgrader costs seconds and ``distlab grade`` never does;
    ``tests/test_release.py`` checks it against nbgrader's on every released cell)."""
    meta = _nbgrader(cell)
    solution, graded = bool(meta.get("solution", False)), bool(meta.get("grade", False))
    locked = False if solution else (True if graded else bool(meta.get("locked", False)))
    digest = hashlib.md5()  # nbgrader's choice, not a security measure
    for part in (cell["source"], cell["cell_type"], str(graded), str(solution), str(locked)):
        digest.update(part.encode("utf-8"))
    digest.update(meta["grade_id"].encode("utf-8"))
    if graded:
        digest.update(str(float(meta["points"])).encode("utf-8"))
    return digest.hexdigest()


def is_untouched(cell) -> bool:
    """Whether a released cell is still as released (its checksum matches the stored one):
    for a solution cell, the learner has not started it."""
    stored = _nbgrader(cell).get("checksum")
    return bool(stored) and stored == checksum(cell)


def _signatures(source: str) -> list[str]:
    """The ``def``/``class`` lines of a cell, stripped."""
    return [
        line.strip() for line in source.splitlines() if line.lstrip().startswith(("def ", "class "))
    ]


def _solution_change(mine: str, now: str) -> str | None:
    """A changed stub, told from the learner's cell (which may define more, helpers of its
    own): a function of the stub the cell does not define as such, or the first given line of
    the stub that the cell lacks; None when it has both (a change in spacing only)."""
    old_defs = _signatures(mine)
    missing = [line for line in _signatures(now) if line not in old_defs]
    if missing:  # a function (or class) of the stub that the learner's cell does not define
        name = missing[0].split("(")[0].split(":")[0]
        theirs = next((line for line in old_defs if line.split("(")[0].split(":")[0] == name), None)
        yours = f" (your copy: `{_short(theirs)}`)" if theirs else ""
        return f"the code to write is now `{_short(missing[0])}`{yours}"
    given = [line.strip() for line in now.splitlines() if line.strip() not in ("", *STUB_LINES)]
    lines = {line.strip() for line in mine.splitlines()}
    added = next((line for line in given if line not in lines), None)
    return f"its starting code changed: `{_short(added)}`" if added else None


def first_difference(old: str, new: str) -> str:
    """The first line that differs between two sources, in a few words."""
    a, b = old.splitlines(), new.splitlines()
    for tag, i1, _, j1, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "replace":
            return f"`{_short(a[i1])}` is now `{_short(b[j1])}`"
        if tag == "delete":
            return f"`{_short(a[i1])}` was removed"
        if tag == "insert":
            return f"`{_short(b[j1])}` was added"
    return "only its spacing"


def _short(line: str, width: int = 60) -> str:
    line = " ".join(line.split())
    return line if len(line) <= width else line[: width - 3] + "..."
