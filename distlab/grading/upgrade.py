"""Move a learner's work into the current release of its notebook (``distlab course upgrade``).

:func:`carry` builds the current release's notebook with the learner's work put in:

* each solution cell, matched by grade id: the learner's source in the release's cell (its
  metadata, hence its checksum, stay the release's). A cell the learner never started stays
  the current stub, which may have changed;
* each cell the learner added, after the cell it followed. Added means: not a cell of the
  copy's own release (:mod:`distlab.grading.release` records their ids); for a copy made
  before releases were recorded, any cell the current release does not have.

Everything else is the current release's: explanations, demos, tests, read-only cells. What
cannot be carried (a solution cell whose exercise the release no longer has) is listed.

``distlab grade`` grades a copy from an older release the same way (:func:`to_grade`): the
learner's solutions in the current notebook, so that a demo cell that no longer runs with
today's library does not cost the exercises their points, and the grade is the one the
learner gets after upgrading.
"""

from __future__ import annotations

import copy as copying
import os
import shlex
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from distlab.core.course import SOURCE_DIR, find_course_root, released_notebook
from distlab.grading.cells import HIDDEN_MARK, grade_id_of, is_graded, is_solution
from distlab.grading.release import (
    Comparison,
    compare,
    describe_release,
    is_untouched,
    release_of,
)
from distlab.grading.resolve import identify

BACKUP_DIR = "backups"  # beside the learner's file; distlab grade never looks in it
UPGRADE_COMMAND = "distlab course upgrade {path}"


@dataclass
class Carried:
    """What :func:`carry` moved into the current release, and what it could not."""

    solutions: list[str] = field(default_factory=list)  # grade ids carried
    not_started: list[str] = field(default_factory=list)  # left as the current stub
    missing: list[str] = field(default_factory=list)  # the copy has no such cell
    own_cells: list[str] = field(default_factory=list)  # cells the learner added, carried
    not_carried: list[str] = field(default_factory=list)  # one line each


def _first_line(cell) -> str:
    line = next((s.strip() for s in cell.get("source", "").splitlines() if s.strip()), "")
    return line if len(line) <= 50 else line[:47] + "..."


def carry(copy, released) -> tuple[object, Carried]:
    """The current release ``released`` with the learner's work from ``copy`` put in (see the
    module's docstring); neither argument is changed."""
    result, carried = copying.deepcopy(released), Carried()
    theirs = {grade_id_of(c): c for c in copy["cells"] if grade_id_of(c) and is_solution(c)}
    for cell in result["cells"]:
        grade_id = grade_id_of(cell)
        if not is_solution(cell):
            continue
        mine = theirs.pop(grade_id, None)
        if mine is None:
            carried.missing.append(grade_id)
        elif is_untouched(mine):
            carried.not_started.append(grade_id)
        else:
            cell["source"] = mine["source"]
            carried.solutions.append(grade_id)
    for grade_id, mine in theirs.items():
        carried.not_carried.append(
            f"solution cell {grade_id} (`{_first_line(mine)}`): the current release has no "
            "such exercise"
        )
    _carry_own_cells(copy, result, carried)
    return result, carried


def _carry_own_cells(copy, result, carried: Carried) -> None:
    """Insert the cells the learner added to ``copy`` into ``result``, each after the cell it
    followed in ``copy`` (at the top if it followed none that ``result`` has)."""
    record = release_of(copy)
    course_ids = set(record.get("cells", [])) if record else set()
    anchor = -1  # where in ``result`` the last cell seen stands
    for cell in copy["cells"]:
        ids = [c.get("id") for c in result["cells"]]
        if cell.get("id") in ids:
            anchor = ids.index(cell.get("id"))
        elif not grade_id_of(cell) and cell.get("id") not in course_ids:
            anchor += 1
            result["cells"].insert(anchor, copying.deepcopy(cell))
            carried.own_cells.append(f"{cell.get('cell_type')} cell `{_first_line(cell)}`")
        # else: the course's, a cell of the copy's release that the current one dropped


# ------------------------------------------------------------- for the grader ---
def upgrade_command(path: str | os.PathLike) -> str:
    return UPGRADE_COMMAND.format(path=shlex.quote(str(path)))


def release_notes(
    comparison: Comparison | None, path: str | os.PathLike, test_ids=None
) -> list[str]:
    """The report's lines about a copy that is not the current release (none for a current
    copy). ``test_ids``: name only the changes of these exercises (default: all)."""
    if comparison is None or comparison.current:
        return []
    changes = [c for c in comparison.changes if test_ids is None or c.test_id in test_ids]
    head = (
        f"your copy is not the current release of this notebook (yours: "
        f"{describe_release(comparison.copy)}; now: {describe_release(comparison.now)}): your "
        "solutions were graded in the current release's notebook"
    )
    lines = [head]
    if changes:
        lines.append("changed since your copy's release:")
        lines += [f"  {change.line}" for change in changes]
    else:
        lines.append(f"{'this exercise is' if test_ids else 'its exercises are'} as in your copy")
    lines.append(f"move your work to the current release: {upgrade_command(path)}")
    return lines


def to_grade(learner, assignment: str, notebook: str, root=None):
    """(the notebook to grade for the learner's notebook ``learner``, how it compares with the
    current release): ``learner`` itself when it is the current release, else the learner's
    work carried into the current release (:func:`carry`). Where the course has no released
    notebook to compare with, or ``learner`` is a source notebook (its hidden tests in it),
    ``learner`` and None."""
    import nbformat

    released_path = released_notebook(find_course_root(root), assignment, notebook)
    source = any(HIDDEN_MARK in c.get("source", "") for c in learner["cells"] if is_graded(c))
    if source or not released_path.is_file():
        return learner, None
    released = nbformat.read(released_path, as_version=4)
    comparison = compare(learner, released)
    if comparison.current:
        return learner, comparison
    carried, _ = carry(learner, released)
    return carried, comparison


# ---------------------------------------------------------------- the command ---
@dataclass
class Upgrade:
    """What ``distlab course upgrade`` did to one file."""

    path: Path
    assignment: str
    comparison: Comparison
    carried: Carried | None  # None: the file was the current release already
    backup: Path | None

    def report(self) -> str:
        now = describe_release(self.comparison.now)
        if self.carried is None:
            return f"{self.path} is the current release of {self.assignment} ({now}): nothing to do"
        head = (
            f"upgraded {self.path} to the current release of {self.assignment} ({now}; your "
            f"copy: {describe_release(self.comparison.copy)})"
        )
        lines = [head, f"your file as it was: {self.backup}"]
        done = self.carried
        lines.append(f"carried your solutions: {', '.join(done.solutions) or 'none'}")
        if done.own_cells:
            lines.append(f"carried the cells you added: {'; '.join(done.own_cells)}")
        if done.not_started:
            lines.append(
                f"not started in your copy (the current stub): {', '.join(done.not_started)}"
            )
        if done.missing:
            lines.append(f"not in your copy (the current stub): {', '.join(done.missing)}")
        if self.comparison.changes:
            lines.append("exercises that changed (check your solution against the new text):")
            lines += [f"  {change.line}" for change in self.comparison.changes]
        lines.append("could not carry:" if done.not_carried else "could not carry: nothing")
        lines += [f"  {line}" for line in done.not_carried]
        lines.append(
            "your edits to the course's own cells (text, demos, tests) are not carried; the "
            "backup keeps them"
        )
        return "\n".join(lines)


def upgrade(path: str | os.PathLike, root=None, now: datetime | None = None) -> Upgrade:
    """Carry the learner's work in ``path`` into the current release of its notebook, in
    place, after copying the file to ``backups/`` beside it. Refuses (ValueError) a file that
    is not a course notebook, and the course's source notebooks."""
    import nbformat

    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"no such notebook: {path}")
    path = path.resolve()
    source_root = find_course_root(root)
    if path.resolve().is_relative_to((source_root / SOURCE_DIR).resolve()):
        raise ValueError(
            f"{path} is a source notebook of the course (solutions and hidden tests), not a "
            "learner's copy: nothing to upgrade"
        )
    assignment, notebook = identify(path, root)
    learner = nbformat.read(path, as_version=4)
    released_path = released_notebook(source_root, assignment, notebook)
    if not released_path.is_file():
        raise ValueError(f"the course has no released notebook {released_path} to upgrade to")
    released = nbformat.read(released_path, as_version=4)
    comparison = compare(learner, released)
    if comparison.current:
        return Upgrade(path, assignment, comparison, None, None)
    upgraded, carried = carry(learner, released)
    backup = _backup(path, now or datetime.now())
    nbformat.write(upgraded, path)
    return Upgrade(path, assignment, comparison, carried, backup)


def _backup(path: Path, now: datetime) -> Path:
    """Copy ``path`` to ``backups/<stem>-before-upgrade-<time>.ipynb`` beside it (never over an
    earlier backup)."""
    folder = path.parent / BACKUP_DIR
    folder.mkdir(exist_ok=True)
    stem = f"{path.stem}-before-upgrade-{now:%Y%m%d-%H%M%S}"
    backup, n = folder / f"{stem}{path.suffix}", 1
    while backup.exists():
        n += 1
        backup = folder / f"{stem}-{n}{path.suffix}"
    shutil.copy2(path, backup)
    return backup
