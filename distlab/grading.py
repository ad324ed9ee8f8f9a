"""``distlab grade NOTEBOOK``: autograde one course notebook on your own machine.

nbgrader grades in a *course directory* (``solutions/``, ``course/``,
``submitted/<student>/``, ``autograded/<student>/`` and a gradebook
database). A learner working alone has none of that, so this module builds a
throw-away one:

1. copy ``nbgrader_config.py`` and the assignment's source notebooks
   (``solutions/NN-topic/``) into a temporary folder and run
   ``nbgrader generate_assignment`` there, which records every graded cell,
   its points and the checksum of every read-only cell in the gradebook;
2. put the learner's notebook in ``submitted/<student>/NN-topic/`` and run
   ``nbgrader autograde``: it restores any edited test cell from the gradebook,
   puts the hidden tests back, executes the notebook and scores each test cell;
3. read the points from the gradebook and the failing assertion of each test
   cell from the executed notebook.

The same functions build the course directory that ``tests/test_course.py``
grades, so the learner's grader and the course's tests cannot drift apart.

Each graded test cell of a source notebook may carry ``metadata.distlab``:
``{"exercise": "<title>", "flashcards": "<notebook>#<section>"}``; a failed
exercise then suggests ``flashcards drill --notebook <notebook>#<section>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_FILE = "nbgrader_config.py"
SOURCE_DIR = "solutions"
RELEASE_DIR = "course"
ROOT_ENV_VAR = "DISTLAB_COURSE_ROOT"
DEFAULT_STUDENT = "learner"


# ------------------------------------------------------------ course layout ---
def find_course_root(root: str | os.PathLike | None = None) -> Path:
    """The folder holding ``nbgrader_config.py`` and ``solutions/``.

    ``root`` if given (and nothing else); otherwise ``$DISTLAB_COURSE_ROOT``,
    then the checkout this package was imported from (an editable install or a clone).
    """
    if root is not None:
        candidates = [Path(root)]
    else:
        candidates = [Path(os.environ[ROOT_ENV_VAR])] if os.environ.get(ROOT_ENV_VAR) else []
        candidates.append(Path(__file__).resolve().parents[1])
    for candidate in candidates:
        if (candidate / CONFIG_FILE).is_file() and (candidate / SOURCE_DIR).is_dir():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"no distlab course found (a folder with {CONFIG_FILE} and {SOURCE_DIR}/); tried: {tried}. "
        f"Run from a clone of the distlab repository or set {ROOT_ENV_VAR}."
    )


def assignment_names(root: str | os.PathLike) -> list[str]:
    """Every assignment: the folders of ``solutions/`` that hold a notebook, sorted."""
    source = Path(root) / SOURCE_DIR
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def source_notebooks(root: str | os.PathLike, assignment: str) -> list[Path]:
    return sorted((Path(root) / SOURCE_DIR / assignment).glob("*.ipynb"))


# -------------------------------------------------------------- run nbgrader ---
def nbgrader_env() -> dict[str, str]:
    """The environment for nbgrader: this interpreter's ``bin`` first on PATH
    (nbgrader runs ``alembic`` to create the gradebook, and the kernel must be
    the Python that has distlab installed)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet debugger warning in kernels
    return env


def run_nbgrader(course_dir: str | os.PathLike, *args: str) -> str:
    """Run ``nbgrader ARGS`` in ``course_dir``; return its log, raise RuntimeError on failure."""
    command = [sys.executable, "-m", "nbgrader", *args]
    done = subprocess.run(
        command, cwd=course_dir, env=nbgrader_env(), capture_output=True, text=True, check=False
    )
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed ({done.returncode}):\n{log}")
    return log


def prepare_course(
    course_dir: str | os.PathLike, assignments: list[str] | None = None, root: str | None = None
) -> Path:
    """Copy the config and the source notebooks of ``assignments`` (default: all) into
    ``course_dir`` and generate the released notebooks there (which fills the gradebook)."""
    source_root = find_course_root(root)
    course_dir = Path(course_dir)
    names = assignment_names(source_root) if assignments is None else list(assignments)
    shutil.copy(source_root / CONFIG_FILE, course_dir / CONFIG_FILE)
    for name in names:
        shutil.copytree(
            source_root / SOURCE_DIR / name,
            course_dir / SOURCE_DIR / name,
            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
        )
    pattern = names[0] if len(names) == 1 else "*"
    run_nbgrader(course_dir, "generate_assignment", pattern, "--create", "--force")
    return course_dir


def submit(course_dir: str | os.PathLike, student: str, assignment: str, notebook: Path) -> Path:
    """Place ``notebook`` as ``student``'s submission of ``assignment`` (keeps its name)."""
    target = Path(course_dir) / "submitted" / student / assignment
    target.mkdir(parents=True, exist_ok=True)
    destination = target / Path(notebook).name
    shutil.copy(notebook, destination)
    return destination


def autograde(course_dir: str | os.PathLike, assignment: str = "*", student: str = "*") -> str:
    """Autograde every matching submission (globs allowed); return nbgrader's log."""
    return run_nbgrader(
        course_dir, "autograde", assignment, "--student", student, "--create", "--force"
    )


# ------------------------------------------------------------- read results ---
@dataclass(frozen=True)
class ExerciseScore:
    """One graded test cell of a submission."""

    grade_id: str
    title: str
    points: float
    max_points: float
    failure: str | None  # the error the test cell raised, None if it passed
    flashcards: str | None  # "<notebook>#<section>" to review, from the cell's metadata
    raised_in: str | None = None  # the notebook function the error came from, if any

    @property
    def passed(self) -> bool:
        return self.points >= self.max_points


@dataclass
class NotebookGrade:
    """The autograded result of one notebook."""

    assignment: str
    notebook: str
    exercises: list[ExerciseScore]
    edited_test_cells: list[str] = field(default_factory=list)

    @property
    def points(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        return sum(e.max_points for e in self.exercises)


def read_grade(
    course_dir: str | os.PathLike, student: str, assignment: str, notebook: str
) -> NotebookGrade:
    """Points per graded cell from the gradebook, failures from the autograded notebook."""
    import nbformat
    from nbgrader.api import Gradebook

    course_dir = Path(course_dir)
    autograded = course_dir / "autograded" / student / assignment / f"{notebook}.ipynb"
    executed = nbformat.read(autograded, as_version=4)
    failures = {
        _grade_id(cell): _failure(cell.get("outputs", []))
        for cell in executed.cells
        if _grade_id(cell) is not None
    }
    raisers = {
        _grade_id(cell): raised_in(cell.get("outputs", []))
        for cell in executed.cells
        if _grade_id(cell) is not None
    }
    source = nbformat.read(course_dir / SOURCE_DIR / assignment / f"{notebook}.ipynb", as_version=4)
    info = {_grade_id(c): c.metadata.get("distlab", {}) for c in source.cells if _grade_id(c)}
    order = [_grade_id(c) for c in source.cells if _is_graded(c)]
    db_url = f"sqlite:///{course_dir / 'gradebook.db'}"
    with Gradebook(db_url) as gradebook:
        submission = gradebook.find_submission_notebook(notebook, assignment, student)
        grades = {g.name: (float(g.score), float(g.max_score)) for g in submission.grades}
    exercises = []
    for grade_id in order:
        points, max_points = grades[grade_id]
        meta = info.get(grade_id, {})
        exercises.append(
            ExerciseScore(
                grade_id=grade_id,
                title=meta.get("exercise", grade_id),
                points=points,
                max_points=max_points,
                failure=failures.get(grade_id) if points < max_points else None,
                flashcards=meta.get("flashcards"),
                raised_in=raisers.get(grade_id) if points < max_points else None,
            )
        )
    return NotebookGrade(assignment, notebook, exercises)


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _is_graded(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and cell.get("cell_type") == "code"


def _failure(outputs) -> str | None:
    """``ExcType: message`` of a cell's error; for a failed rank, the rank's own last line too."""
    for output in outputs:
        if output.get("output_type") != "error":
            continue
        value = str(output.get("evalue", "")).strip()
        lines = [line for line in value.splitlines() if line.strip()]
        head = f"{output.get('ename', 'Error')}: {lines[0] if lines else ''}".rstrip(": ")
        if len(lines) > 1:  # a RankError carries the rank's traceback; its last line is the cause
            return f"{head}\n{lines[-1].strip()}"
        return head
    return None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_IPYTHON_FRAME = re.compile(r"^(Cell In\[\d+\]), line \d+, in (\w+)")
_IPYTHON_FILE_FRAME = re.compile(r"^File ([^\n]*?):\d+, in (\w+)")
_PYTHON_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+, in (\S+)$', re.MULTILINE)


def _is_notebook_code(where: str) -> bool:
    """A frame in code the learner's notebook defined: an IPython cell, or a function
    defined in a cell and shipped to a worker (its file is ``/tmp/ipykernel_<pid>/...``)."""
    return where.startswith("Cell In[") or "ipykernel_" in where


def raised_in(outputs) -> str | None:
    """The function of the learner's notebook that raised a cell's error: the innermost
    frame in notebook code (for a :class:`distlab.RankError`, of the failing rank), or
    None if the error was raised by the test cell itself."""
    for output in outputs:
        if output.get("output_type") != "error":
            continue
        frames = []  # (where, function), outermost first
        for entry in output.get("traceback", []):
            first_line = _ANSI.sub("", entry).splitlines()[0] if entry.strip() else ""
            match = _IPYTHON_FRAME.match(first_line) or _IPYTHON_FILE_FRAME.match(first_line)
            if match:
                frames.append((match.group(1), match.group(2)))
        if output.get("ename") == "RankError":  # the rank's traceback is in the message
            frames += _PYTHON_FRAME.findall(str(output.get("evalue", "")))
        notebook = [name for where, name in frames if _is_notebook_code(where)]
        return notebook[-1] if notebook and notebook[-1] != "<module>" else None
    return None


# ------------------------------------------------------- one learner notebook ---
def identify(notebook_path: str | os.PathLike, root: str | None = None) -> tuple[str, str]:
    """(assignment, notebook name) of a learner's notebook, matched by its graded cells' ids."""
    import nbformat

    path = Path(notebook_path)
    if not path.is_file():
        raise FileNotFoundError(f"no such notebook: {path}")
    if path.suffix != ".ipynb":
        raise ValueError(f"{path} is not a notebook (expected a .ipynb file)")
    try:
        learner = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a notebook"
        raise ValueError(f"{path} could not be read as a Jupyter notebook: {exc}") from None
    ids = {_grade_id(c) for c in learner.cells if _is_graded(c)}
    source_root = find_course_root(root)
    matches = []
    for assignment in assignment_names(source_root):
        for source in source_notebooks(source_root, assignment):
            nb = nbformat.read(source, as_version=4)
            graded = {_grade_id(c) for c in nb.cells if _is_graded(c)}
            if graded and graded & ids:
                matches.append((len(graded & ids), assignment, source.stem))
    if not matches:
        known = ", ".join(assignment_names(source_root))
        raise ValueError(
            f"{path} is not part of the distlab course: none of its cells is a graded test "
            f"cell of the course notebooks ({known}). Grade a notebook from course/."
        )
    _, assignment, name = max(matches)
    return assignment, name


def find_notebook(notebook: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The learner's notebook that ``notebook`` names, tried in this order:

    1. a path, relative to the current folder (``course/02-collectives/02-collectives.ipynb``);
    2. the same path relative to the course root, so the README's command also works from a
       terminal opened in ``course/`` (JupyterLab starts its terminals there);
    3. an assignment's name, ``02-collectives`` or just ``02`` (``.ipynb`` optional):
       ``course/02-collectives/02-collectives.ipynb`` under the course root.
    """
    given = Path(notebook).expanduser()
    if given.is_file():
        return given
    tried = [str(given)]
    try:
        source_root = find_course_root(root)
    except FileNotFoundError:
        source_root = None
    if source_root is not None and not given.is_absolute():
        candidates = [source_root / given]
        name = given.name.removesuffix(".ipynb")
        if len(given.parts) == 1:
            names = assignment_names(source_root)
            matches = [a for a in names if a == name or a.split("-", 1)[0] == name]
            candidates += [source_root / RELEASE_DIR / a / f"{a}.ipynb" for a in matches]
        for candidate in candidates:
            if candidate.is_dir():  # an assignment folder: its notebook of the same name
                candidate = candidate / f"{candidate.name}.ipynb"
            if candidate.is_file():
                return candidate
            tried.append(str(candidate))
    known = ", ".join(assignment_names(source_root)) if source_root else "none found"
    raise FileNotFoundError(
        f"no such notebook: {notebook} (tried {', '.join(dict.fromkeys(tried))}). Give a path "
        f"to your notebook, or the name of a course notebook: {known}"
    )


def edited_test_cells(notebook_path: str | os.PathLike) -> list[str]:
    """grade_ids of read-only cells whose checksum no longer matches (nbgrader's Validator check)."""
    from nbgrader.validator import Validator

    report = Validator(preprocessors=[]).validate(str(Path(notebook_path).resolve()))
    changed = {c["source"] for c in report.get("changed", [])}
    import nbformat

    nb = nbformat.read(notebook_path, as_version=4)
    return [_grade_id(c) or "?" for c in nb.cells if c.source.strip() in changed]


def grade_notebook(
    notebook_path: str | os.PathLike,
    root: str | None = None,
    keep: str | None = None,
    progress: bool = False,
) -> NotebookGrade:
    """Autograde one learner notebook in a temporary course directory.

    ``notebook_path``: anything :func:`find_notebook` accepts (a path, or a name).

    ``keep``: a folder to build the course directory in (kept afterwards, for
    inspecting the autograded notebook); default a temporary one, deleted.

    ``progress=True`` shows a progress bar on stderr (on a terminal only) while nbgrader
    builds the course directory and runs the notebook.
    """
    from distlab.progress import progress_bar

    notebook_path = find_notebook(notebook_path, root)
    assignment, notebook = identify(notebook_path, root)
    edited = edited_test_cells(notebook_path)
    with (
        tempfile.TemporaryDirectory(prefix="distlab-grade-") as tmp,
        progress_bar(f"grading {notebook}", total=3, enabled=progress) as bar,
    ):
        course_dir = Path(keep) if keep else Path(tmp)
        course_dir.mkdir(parents=True, exist_ok=True)
        bar.step("building a course directory (nbgrader generate_assignment)")
        prepare_course(course_dir, [assignment], root)
        bar.advance()
        learner = Path(tmp) / "upload" / f"{notebook}.ipynb"
        learner.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(notebook_path, learner)
        submit(course_dir, DEFAULT_STUDENT, assignment, learner)
        bar.advance()
        bar.step(f"running {notebook} and its tests (nbgrader autograde)")
        autograde(course_dir, assignment, DEFAULT_STUDENT)
        grade = read_grade(course_dir, DEFAULT_STUDENT, assignment, notebook)
        bar.advance()
    grade.edited_test_cells = edited
    return grade


def flashcard_suggestions(grade: NotebookGrade) -> list[tuple[str, int | None]]:
    """(section, number of cards or None if the deck cannot be read) for each failed exercise."""
    sections = []
    for exercise in grade.exercises:
        if not exercise.passed and exercise.flashcards and exercise.flashcards not in sections:
            sections.append(exercise.flashcards)
    try:
        from flashcards.model import load_deck

        deck = load_deck()
    except ImportError:
        return [(s, None) for s in sections]
    return [(s, len(deck.filter(notebook=s))) for s in sections]


def format_report(grade: NotebookGrade) -> str:
    lines = [
        f"{grade.assignment}/{grade.notebook}.ipynb: {grade.points:g} / {grade.max_points:g} points"
    ]
    if grade.edited_test_cells:
        lines.append(
            f"note: {len(grade.edited_test_cells)} read-only test cell(s) were edited "
            f"({', '.join(grade.edited_test_cells)}); they were graded with the original tests."
        )
    width = max((len(e.title) for e in grade.exercises), default=0)
    for e in grade.exercises:
        status = "passed" if e.passed else "FAILED"
        lines.append(f"  {e.title:<{width}}  {e.points:g}/{e.max_points:g}  {status}")
        if e.failure:
            lines.extend(f"      {line}" for line in e.failure.splitlines())
        if e.failure and e.raised_in:
            lines.append(f"      raised in {e.raised_in}()")
    suggestions = flashcard_suggestions(grade)
    if suggestions:
        lines.append("Review the topics you missed:")
        for section, n_cards in suggestions:
            count = "" if n_cards is None else f"   ({n_cards} card{'' if n_cards == 1 else 's'})"
            lines.append(f"  flashcards drill --notebook {section}{count}")
    return "\n".join(lines)


# ------------------------------------------------------------------------ CLI ---
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
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--course-root", help=f"the course checkout (default: ${ROOT_ENV_VAR} or this package's)"
    )
    parser.add_argument(
        "--keep", metavar="DIR", help="build the course directory in DIR and keep it"
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        grade = grade_notebook(args.notebook, args.course_root, args.keep, progress=not args.json)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    if args.json:
        payload = {
            "assignment": grade.assignment,
            "notebook": grade.notebook,
            "points": grade.points,
            "max_points": grade.max_points,
            "edited_test_cells": grade.edited_test_cells,
            "exercises": [e.__dict__ for e in grade.exercises],
        }
        print(json.dumps(payload, indent=2))
    else:
        print(format_report(grade))
    return 0 if grade.points >= grade.max_points else 1
