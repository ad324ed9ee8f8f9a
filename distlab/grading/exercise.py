"""Grade one exercise in seconds: run only the cells its tests need.

A whole notebook runs every demo before it reaches the last exercise. To grade
exercise K alone, the grader keeps the cells its test cells need
(:func:`distlab.grading.slicing.needed_cells`) and runs just those.

The cells come from the learner's notebook (their solutions, their own extra
cells); each graded test cell and each read-only cell is taken from the source notebook,
hidden tests included, exactly as ``nbgrader autograde`` restores them. A copy from an older
release is first carried into the current one (:func:`distlab.grading.upgrade.to_grade`), as
the whole-notebook grade does. The cut-down notebook runs in
a contained subprocess (:data:`CHILD`) with the same Execute step as the whole-notebook
grade, in a kernel started before nbgrader loads (:mod:`distlab.grading.kernel`), and there
each test cell scores its points by nbgrader's own rule (``determine_grade``: no error,
nothing on stderr). ``tests/test_grading_mutants.py`` checks, for
every exercise of the course, that the slice gives the solution full marks and the
released stub none, as the whole-notebook grade does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from distlab.core.course import find_course_root, source_notebook
from distlab.grading.cells import (
    KERNEL_DIED,
    MISSING_CELL,
    failure,
    grade_id_of,
    graded_cells,
    is_restored,
    raised_in,
)
from distlab.grading.kernel import RUN_EXECUTED, RUN_NOTEBOOK, RUN_SCORES, RUN_WORK
from distlab.grading.report import ExerciseScore, NotebookGrade, modified_time
from distlab.grading.resolve import Resolved, resolve_notebook
from distlab.grading.run import nbgrader_env, owned_folder, run_contained
from distlab.grading.slicing import needed_cells
from distlab.grading.upgrade import release_notes, to_grade

if TYPE_CHECKING:
    from nbformat import NotebookNode

#: The child that runs the cut-down notebooks, ``python -m CHILD RUN [RUN ...] [--timeout S]``
#: (a folder per exercise, see :data:`~distlab.grading.kernel.RUN_NOTEBOOK`): it starts the
#: first notebook's kernel and its early imports, loads nbgrader meanwhile, and executes each
#: notebook as nbgrader would, each in a fresh kernel of its own (see its ``main``).
CHILD = "distlab.grading.kernel"


def choose_tests(source, exercise: str | int) -> list[str]:
    """grade ids of the test cells of ``exercise``: its number (1-based, in notebook order),
    a test cell's grade id (``test-ring-all-reduce``, or without ``test-``), or the start of
    an exercise title (case, spaces and hyphens alike: ``ring-all-reduce`` fits "Ring
    all-reduce"). ValueError names the choices."""
    tests = graded_cells(source)
    ids = [grade_id_of(c) for c in tests]
    titles = [c.metadata.get("distlab", {}).get("exercise", grade_id_of(c)) for c in tests]
    text = str(exercise).strip()
    if text.isdigit() and 1 <= int(text) <= len(ids):
        return [ids[int(text) - 1]]
    for grade_id in (text, f"test-{text}"):
        if grade_id in ids:
            return [grade_id]
    wanted = _loose(text)
    matches = [i for i, t in zip(ids, titles) if _loose(t).startswith(wanted)] if wanted else []
    if len(matches) == 1:
        return matches
    listing = "; ".join(f"{n}: {i} ({t})" for n, (i, t) in enumerate(zip(ids, titles), 1))
    raise ValueError(f"no single exercise matches {exercise!r}; the exercises are {listing}")


def _loose(text: str) -> str:
    """``text`` in lower case, each run of spaces, hyphens and underscores one space."""
    return " ".join(text.lower().replace("-", " ").replace("_", " ").split())


def exercise_notebook(learner, source, test_ids: list[str]):
    """The notebook to run for ``test_ids``: the learner's cells, with each graded test cell
    and read-only cell as in the source (hidden tests included), cut to what those tests
    need."""
    import nbformat

    originals = {grade_id_of(c): c for c in source.cells if is_restored(c) and grade_id_of(c)}
    cells = []
    for cell in learner.cells:
        if cell.cell_type != "code":
            continue
        original = originals.get(grade_id_of(cell))
        cells.append(nbformat.from_dict(dict(original if original is not None else cell)))
    for cell in cells:
        cell.outputs, cell.execution_count = [], None
    targets = [i for i, c in enumerate(cells) if grade_id_of(c) in test_ids]
    if not targets:
        return None
    keep = needed_cells([c.source for c in cells], targets)
    run = nbformat.v4.new_notebook(metadata=learner.metadata)
    run.cells = [cells[i] for i in keep]
    return run


def grade_exercise(
    notebook_path: str | os.PathLike,
    exercise: str | int,
    root: str | None = None,
    timeout: int | None = None,
) -> NotebookGrade:
    """Grade one exercise of a learner's notebook by running only the cells it needs.

    Returns a :class:`~distlab.grading.report.NotebookGrade` holding that exercise's test
    cells, scored as ``nbgrader autograde`` scores them.
    """
    return grade_exercises([(notebook_path, exercise)], root, timeout)[0]


def grade_exercises(
    requests: Iterable[tuple[str | os.PathLike, str | int]],
    root: str | None = None,
    timeout: int | None = None,
) -> list[NotebookGrade]:
    """:func:`grade_exercise` for each ``(notebook, exercise)`` of ``requests``, in order:
    several learners' copies of one exercise, or several exercises of one copy.

    Each exercise runs in a fresh kernel of its own, exactly as it would alone; they share
    only the child process that drives the kernels (:data:`CHILD`), so nbgrader and the
    child start once, not once per exercise (about 2 s of CPU saved per exercise after the
    first). A ``ValueError`` for any request (no such exercise) is raised before anything
    runs."""
    prepared = [_prepare(path, exercise, root) for path, exercise in requests]
    ran = iter(_execute([(p.run, p.folder) for p in prepared if p.run is not None], timeout))
    grades = []
    for p in prepared:
        executed, points = ({}, {}) if p.run is None else next(ran)
        exercises = [
            _score(c, executed, points)
            for c in graded_cells(p.source)
            if grade_id_of(c) in p.test_ids
        ]
        grades.append(
            NotebookGrade(
                p.found.assignment,
                p.found.notebook,
                exercises,
                path=str(p.found.path),
                modified=p.modified,
                note=p.found.note,
                release=release_notes(p.release, p.found.path, p.test_ids),
            )
        )
    return grades


@dataclass
class _Prepared:
    """One requested exercise, ready to run: the learner's notebook found, its source, the
    test cells chosen, and the cut-down notebook (``run``; None when nothing runs)."""

    found: Resolved
    modified: str  # the learner's file's modification time, as the report shows it
    source: NotebookNode
    test_ids: list[str]
    release: object  # what to_grade carried over from an older release, for release_notes
    run: NotebookNode | None

    @property
    def folder(self) -> Path:
        return self.found.path.parent


def _prepare(notebook_path, exercise, root) -> _Prepared:
    import nbformat

    found = resolve_notebook(notebook_path, root)
    modified = modified_time(found.path)
    learner = nbformat.read(found.path, as_version=4)
    source_path = source_notebook(find_course_root(root), found.assignment, found.notebook)
    source = nbformat.read(source_path, as_version=4)
    test_ids = choose_tests(source, exercise)
    learner, release = to_grade(learner, found.assignment, found.notebook, root)
    run = exercise_notebook(learner, source, test_ids)
    return _Prepared(found, modified, source, test_ids, release, run)


def _score(test_cell, executed: dict, scores: dict[str, float]) -> ExerciseScore:
    """The test cell's points (``scores``: what nbgrader's ``determine_grade`` gave each
    executed test cell, see :func:`distlab.grading.execute.scores`), and why it lost them."""
    grade_id = grade_id_of(test_cell)
    points = float(test_cell.metadata["nbgrader"].get("points", 0))
    meta = test_cell.metadata.get("distlab", {})
    title = meta.get("exercise", grade_id)
    if grade_id not in executed:
        score, why, where = 0.0, MISSING_CELL, None
    else:
        outputs = executed[grade_id].get("outputs", [])
        score = float(scores.get(grade_id, 0.0))
        why = failure(outputs) if score < points else None
        where = raised_in(outputs) if why else None
    if why and why.startswith("DeadKernelError"):
        why = KERNEL_DIED.format(title=title)
    return ExerciseScore(grade_id, title, score, points, why, meta.get("flashcards"), where)


def child_command(runs: list[Path], timeout: int | None) -> list[str]:
    """The command that executes the notebook of each run folder (:data:`RUN_NOTEBOOK`) and
    writes it back executed, with its test cells' points (:data:`CHILD`)."""
    command = [sys.executable, "-m", CHILD, *map(str, runs)]
    return command + (["--timeout", str(timeout)] if timeout is not None else [])


def _execute(runs: list[tuple], timeout: int | None) -> list[tuple[dict, dict[str, float]]]:
    """Run each ``(notebook, learner's folder)`` of ``runs`` beside copies of the files in
    that folder, in one contained subprocess (nothing it starts outlives it); return, per
    run, each executed graded cell by grade id, and its points."""
    import nbformat

    if not runs:
        return []
    with owned_folder("distlab-exercise-") as tmp:
        folders = []
        for index, (run, folder) in enumerate(runs):
            here = Path(tmp) / f"run-{index}"
            work = here / RUN_WORK  # like autograde: a copy of the files beside the notebook
            work.mkdir(parents=True)
            nbformat.write(run, here / RUN_NOTEBOOK)
            for item in folder.iterdir():
                if item.is_file() and item.suffix != ".ipynb":
                    shutil.copy2(item, work / item.name)
            folders.append(here)
        code, log = run_contained(child_command(folders, timeout), tmp, nbgrader_env())
        if code != 0 or not all((f / RUN_SCORES).exists() for f in folders):
            raise RuntimeError(f"running the exercise's cells failed ({code}):\n{log[-3000:]}")
        results = []
        for here in folders:
            executed = nbformat.read(here / RUN_EXECUTED, as_version=4)
            scores = json.loads((here / RUN_SCORES).read_text(encoding="utf-8"))
            results.append(({grade_id_of(c): c for c in executed.cells if grade_id_of(c)}, scores))
    return results
