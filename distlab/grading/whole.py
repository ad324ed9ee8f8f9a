"""Grade a whole notebook with nbgrader, in a throw-away course directory.

nbgrader grades in a *course directory* (``solutions/``, ``course/``,
``submitted/<student>/``, ``autograded/<student>/`` and a gradebook
database). A learner working alone has none of that, so :func:`grade_notebook` builds one:

1. copy ``nbgrader_config.py`` and the assignment's source notebooks
   (``solutions/NN-topic/``) into a temporary folder and run
   ``nbgrader generate_assignment`` there, which records every graded cell,
   its points and the checksum of every read-only cell in the gradebook;
2. put the learner's notebook in ``submitted/<student>/NN-topic/`` and run
   ``nbgrader autograde``: it restores any edited test cell from the gradebook,
   puts the hidden tests back, executes the notebook and scores each test cell;
3. read the points from the gradebook and the failing assertion of each test
   cell from the executed notebook.

:func:`grade_notebook` runs steps 1 and 2 and reads the gradebook in one contained child
process (:mod:`distlab.grading.nbgrader_main`): nbgrader loads once, and the ``distlab
grade`` process itself never imports it.

The same functions build the course directory that ``tests/test_course.py``
grades, so the learner's grader and the course's tests cannot drift apart.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from distlab.core.course import (
    CONFIG_FILE,
    RELEASE_DIR,
    SOURCE_DIR,
    assignment_names,
    find_course_root,
    source_notebook,
)
from distlab.grading.cells import (
    HIDDEN_MARK,
    KERNEL_DIED,
    MISSING_CELL,
    failure,
    grade_id_of,
    graded_cells,
    kernel_deaths,
    raised_in,
)
from distlab.grading.report import ExerciseScore, NotebookGrade, modified_time
from distlab.grading.resolve import resolve_notebook
from distlab.grading.run import RESULTS, THEN, owned_folder, run_nbgrader
from distlab.grading.upgrade import release_notes, to_grade
from distlab.progress import progress_bar

DEFAULT_STUDENT = "learner"

# Appended to the course directory's copy of the config: distlab's Execute step (timeouts
# and dead kernels reported per cell, see distlab.grading.execute) in place of nbgrader's.
EXECUTE_CONFIG = """
from nbgrader.converters.autograde import Autograde
from nbgrader.preprocessors import Execute
from distlab.grading.execute import GuardedExecute

c.Autograde.autograde_preprocessors = [
    GuardedExecute if step is Execute else step
    for step in Autograde.class_traits()["autograde_preprocessors"].default()
]
"""


# ----------------------------------------------------------- course directory ---
def prepare_course(
    course_dir: str | os.PathLike, assignments: list[str] | None = None, root: str | None = None
) -> Path:
    """Copy the config and the source notebooks of ``assignments`` (default: all) into
    ``course_dir`` and generate the released notebooks there (which fills the gradebook)."""
    names = copy_sources(course_dir, assignments, root)
    run_nbgrader(course_dir, *_generate(names))
    return Path(course_dir)


def copy_sources(
    course_dir: str | os.PathLike, assignments: list[str] | None = None, root: str | None = None
) -> list[str]:
    """Copy the config (with :data:`EXECUTE_CONFIG`) and the source notebooks of
    ``assignments`` (default: all) into ``course_dir``; return the assignments' names."""
    source_root = find_course_root(root)
    course_dir = Path(course_dir)
    names = assignment_names(source_root) if assignments is None else list(assignments)
    config = (source_root / CONFIG_FILE).read_text(encoding="utf-8")
    (course_dir / CONFIG_FILE).write_text(config + EXECUTE_CONFIG, encoding="utf-8")
    for name in names:
        shutil.copytree(
            source_root / SOURCE_DIR / name,
            course_dir / SOURCE_DIR / name,
            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
        )
    return names


def _generate(names: list[str]) -> list[str]:
    """The ``nbgrader generate_assignment`` arguments for ``names``."""
    return ["generate_assignment", names[0] if len(names) == 1 else "*", "--create", "--force"]


def _autograde(assignment: str, student: str, timeout: int | None) -> list[str]:
    """The ``nbgrader autograde`` arguments (``timeout``: seconds a cell may run)."""
    limit = [] if timeout is None else [f"--Execute.timeout={timeout}"]
    return ["autograde", assignment, "--student", student, "--create", "--force", *limit]


def submit(course_dir: str | os.PathLike, student: str, assignment: str, notebook: Path) -> Path:
    """Place ``notebook`` as ``student``'s submission of ``assignment`` (keeps its name)."""
    target = Path(course_dir) / "submitted" / student / assignment
    target.mkdir(parents=True, exist_ok=True)
    destination = target / Path(notebook).name
    shutil.copy(notebook, destination)
    return destination


def autograde(
    course_dir: str | os.PathLike,
    assignment: str = "*",
    student: str = "*",
    timeout: int | None = None,
) -> str:
    """Autograde every matching submission (globs allowed); return nbgrader's log.

    ``timeout``: seconds a cell may run (default: ``Execute.timeout`` of the config)."""
    return run_nbgrader(course_dir, *_autograde(assignment, student, timeout))


# ---------------------------------------------------------------- read results ---
def read_grade(
    course_dir: str | os.PathLike,
    student: str,
    assignment: str,
    notebook: str,
    scores: dict[str, tuple[float, float]] | None = None,
) -> NotebookGrade:
    """Points per graded cell from the gradebook, failures from the autograded notebook.

    ``scores``: the gradebook's points, when they were read already (by
    :func:`gradebook_scores`, in nbgrader's own process)."""
    import nbformat

    course_dir = Path(course_dir)
    autograded = course_dir / "autograded" / student / assignment / f"{notebook}.ipynb"
    executed = nbformat.read(autograded, as_version=4)
    outputs = {grade_id_of(c): c.get("outputs", []) for c in executed.cells if grade_id_of(c)}
    source = nbformat.read(source_notebook(course_dir, assignment, notebook), as_version=4)
    info = {grade_id_of(c): c.metadata.get("distlab", {}) for c in source.cells if grade_id_of(c)}
    if scores is None:
        scores = gradebook_scores(course_dir, student, assignment, notebook)
    exercises = []
    for grade_id in [grade_id_of(c) for c in graded_cells(source)]:
        points, max_points = scores[grade_id]
        meta = info.get(grade_id, {})
        title = meta.get("exercise", grade_id)
        failed = points < max_points
        why = failure(outputs[grade_id]) if grade_id in outputs else MISSING_CELL
        if why and why.startswith("DeadKernelError"):
            why = KERNEL_DIED.format(title=title)
        exercises.append(
            ExerciseScore(
                grade_id=grade_id,
                title=title,
                points=points,
                max_points=max_points,
                failure=why if failed else None,
                flashcards=meta.get("flashcards"),
                raised_in=raised_in(outputs.get(grade_id, [])) if failed else None,
            )
        )
    return NotebookGrade(assignment, notebook, exercises, problems=kernel_deaths(executed))


def gradebook_scores(
    course_dir: Path, student: str, assignment: str, notebook: str
) -> dict[str, tuple[float, float]]:
    """grade id -> (points, max points), from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission_notebook(notebook, assignment, student)
        return {g.name: (float(g.score), float(g.max_score)) for g in submission.grades}


def edited_test_cells(notebook_path: str | os.PathLike) -> list[str]:
    """grade_ids of read-only cells whose checksum no longer matches (nbgrader's Validator check)."""
    import nbformat
    from nbgrader.validator import Validator

    report = Validator(preprocessors=[]).validate(str(Path(notebook_path).resolve()))
    changed = {c["source"] for c in report.get("changed", [])}
    nb = nbformat.read(notebook_path, as_version=4)
    return [grade_id_of(c) or "?" for c in nb.cells if c.source.strip() in changed]


def learner_copy(autograded: Path, released: Path, out: Path) -> Path:
    """Write to ``out`` the notebook nbgrader ran, as the learner may see it: every cell's
    outputs, but each test cell's source as released (the hidden tests' code left out) and
    each test's error as its type and message only (an IPython traceback prints the lines
    of the cell it stopped in, hidden ones included)."""
    import nbformat

    ran = nbformat.read(autograded, as_version=4)
    public = {grade_id_of(c): c.source for c in nbformat.read(released, as_version=4).cells}
    for cell in ran.cells:
        grade_id = grade_id_of(cell)
        if grade_id in public and cell.source != public[grade_id]:
            cell.source = public[grade_id]
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename')}: {output.get('evalue')}"]
        if HIDDEN_MARK in cell.source:  # a test cell the release does not know
            raise ValueError(f"{autograded}: cell {grade_id!r} still holds hidden tests")
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(ran, out)
    return out


# ------------------------------------------------------------ one learner notebook ---
def grade_notebook(
    notebook_path: str | os.PathLike,
    root: str | None = None,
    keep: str | None = None,
    progress: bool = False,
    timeout: int | None = None,
) -> NotebookGrade:
    """Autograde one learner notebook in a temporary course directory.

    ``notebook_path``: anything :func:`distlab.grading.resolve.resolve_notebook` accepts
    (a path, or a name).

    ``keep``: a folder to write the learner's graded copy in (:func:`learner_copy`: the
    notebook as it ran, with every test's outputs and result, but the hidden tests' code
    left out); by default nothing is kept. The course directory itself, which holds the
    source notebook (solutions and hidden tests), always stays in a temporary folder.

    ``progress=True`` shows a progress bar on stderr (on a terminal only) while nbgrader
    builds the course directory and runs the notebook.

    ``timeout``: seconds a cell may run before it is stopped and reported as timed out
    (default: the course config's ``Execute.timeout``).

    A copy from an older release is graded as :func:`distlab.grading.upgrade.to_grade` says:
    the learner's work in the current release's notebook, and the report says what changed.
    """
    import nbformat

    found = resolve_notebook(notebook_path, root)
    notebook = found.notebook
    with (
        owned_folder("distlab-grade-") as tmp,
        progress_bar(f"grading {notebook}", total=2, enabled=progress) as bar,
    ):
        learner = Path(tmp) / "upload" / f"{notebook}.ipynb"
        learner.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(found.path, learner)  # what is graded cannot change while it runs
        modified = modified_time(learner)
        mine = nbformat.read(learner, as_version=4)
        graded, release = to_grade(mine, found.assignment, notebook, root)
        if graded is not mine:  # from an older release: the learner's work in the current one
            nbformat.write(graded, learner)
        course_dir = Path(tmp) / "course"
        course_dir.mkdir(parents=True, exist_ok=True)
        bar.step("building a course directory")
        copy_sources(course_dir, [found.assignment], root)
        submit(course_dir, DEFAULT_STUDENT, found.assignment, learner)
        bar.advance()
        bar.step(f"running {notebook} and its tests (nbgrader generate_assignment, autograde)")
        results = Path(tmp) / "results.json"
        run_nbgrader(
            course_dir,
            *(RESULTS, str(results), DEFAULT_STUDENT, found.assignment, notebook, str(learner)),
            *(*_generate([found.assignment]), THEN),
            *_autograde(found.assignment, DEFAULT_STUDENT, timeout),
        )
        read = json.loads(results.read_text(encoding="utf-8"))
        scores = {k: tuple(v) for k, v in read["scores"].items()}
        grade = read_grade(course_dir, DEFAULT_STUDENT, found.assignment, notebook, scores)
        bar.advance()
        grade.edited_test_cells = read["edited_test_cells"]
        if keep:
            autograded = course_dir / "autograded" / DEFAULT_STUDENT / found.assignment
            released = course_dir / RELEASE_DIR / found.assignment / f"{notebook}.ipynb"
            kept = Path(keep) / f"{notebook}.ipynb"
            learner_copy(autograded / f"{notebook}.ipynb", released, kept)
            grade.kept = str(kept.resolve())
    grade.path = str(found.path)
    grade.modified = modified
    grade.note = found.note
    grade.release = release_notes(release, found.path)
    return grade
