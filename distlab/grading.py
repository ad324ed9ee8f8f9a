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
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

CONFIG_FILE = "nbgrader_config.py"
SOURCE_DIR = "solutions"
RELEASE_DIR = "course"
ROOT_ENV_VAR = "DISTLAB_COURSE_ROOT"
TIMEOUT_ENV_VAR = "DISTLAB_GRADE_TIMEOUT"  # seconds a cell may run while grading
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
    """Run ``nbgrader ARGS`` in ``course_dir``; return its log, raise RuntimeError on failure.

    Every process it starts (the kernel, and whatever the notebook starts) has ended when
    this returns or raises: see :func:`distlab.grading_run.run_contained`."""
    from distlab.grading_run import run_contained

    command = [sys.executable, "-m", "nbgrader", *args]
    code, log = run_contained(command, course_dir, nbgrader_env())
    if code != 0:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed ({code}):\n{log}")
    return log


# Appended to the course directory's copy of the config: distlab's Execute step (timeouts
# and dead kernels reported per cell, see distlab.grading_execute) in place of nbgrader's.
EXECUTE_CONFIG = """
from nbgrader.converters.autograde import Autograde
from nbgrader.preprocessors import Execute
from distlab.grading_execute import GuardedExecute

c.Autograde.autograde_preprocessors = [
    GuardedExecute if step is Execute else step
    for step in Autograde.class_traits()["autograde_preprocessors"].default()
]
"""


def prepare_course(
    course_dir: str | os.PathLike, assignments: list[str] | None = None, root: str | None = None
) -> Path:
    """Copy the config and the source notebooks of ``assignments`` (default: all) into
    ``course_dir`` and generate the released notebooks there (which fills the gradebook)."""
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


def autograde(
    course_dir: str | os.PathLike,
    assignment: str = "*",
    student: str = "*",
    timeout: int | None = None,
) -> str:
    """Autograde every matching submission (globs allowed); return nbgrader's log.

    ``timeout``: seconds a cell may run (default: ``Execute.timeout`` of the config)."""
    limit = [] if timeout is None else [f"--Execute.timeout={timeout}"]
    return run_nbgrader(
        course_dir, "autograde", assignment, "--student", student, "--create", "--force", *limit
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
    path: str = ""  # the absolute path of the file that was graded
    modified: str = ""  # its modification time, local, "YYYY-MM-DD HH:MM:SS"
    note: str | None = None  # how the file was found, when not in the current folder
    problems: list[str] = field(default_factory=list)  # e.g. the kernel died in a non-test cell

    @property
    def points(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        return sum(e.max_points for e in self.exercises)


MISSING_CELL = (
    "this test cell is missing from your notebook (deleted?), so its tests did not run: "
    "copy it back from the released notebook"
)
KERNEL_DIED = (
    "kernel died while running {title} (os._exit, a crash in native code, or out of memory); "
    "the cells after it ran in a fresh kernel"
)


def read_grade(
    course_dir: str | os.PathLike, student: str, assignment: str, notebook: str
) -> NotebookGrade:
    """Points per graded cell from the gradebook, failures from the autograded notebook."""
    import nbformat

    course_dir = Path(course_dir)
    autograded = course_dir / "autograded" / student / assignment / f"{notebook}.ipynb"
    executed = nbformat.read(autograded, as_version=4)
    outputs = {_grade_id(c): c.get("outputs", []) for c in executed.cells if _grade_id(c)}
    source = nbformat.read(course_dir / SOURCE_DIR / assignment / f"{notebook}.ipynb", as_version=4)
    info = {_grade_id(c): c.metadata.get("distlab", {}) for c in source.cells if _grade_id(c)}
    grades = _gradebook_scores(course_dir, student, assignment, notebook)
    exercises = []
    for grade_id in [_grade_id(c) for c in source.cells if _is_graded(c)]:
        points, max_points = grades[grade_id]
        meta = info.get(grade_id, {})
        title = meta.get("exercise", grade_id)
        failed = points < max_points
        failure = _failure(outputs[grade_id]) if grade_id in outputs else MISSING_CELL
        if failure and failure.startswith("DeadKernelError"):
            failure = KERNEL_DIED.format(title=title)
        exercises.append(
            ExerciseScore(
                grade_id=grade_id,
                title=title,
                points=points,
                max_points=max_points,
                failure=failure if failed else None,
                flashcards=meta.get("flashcards"),
                raised_in=raised_in(outputs.get(grade_id, [])) if failed else None,
            )
        )
    return NotebookGrade(assignment, notebook, exercises, problems=_kernel_deaths(executed))


def _gradebook_scores(course_dir: Path, student: str, assignment: str, notebook: str):
    """grade id -> (points, max points), from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission_notebook(notebook, assignment, student)
        return {g.name: (float(g.score), float(g.max_score)) for g in submission.grades}


def _kernel_deaths(executed) -> list[str]:
    """A line for each cell other than a test cell that killed the kernel."""
    return [
        f"the kernel died while running cell {index + 1} (not a test cell); "
        "the cells after it ran in a fresh kernel"
        for index, cell in enumerate(executed.cells)
        if not _is_graded(cell)
        and any(o.get("ename") == "DeadKernelError" for o in cell.get("outputs", []))
    ]


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _is_graded(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and cell.get("cell_type") == "code"


MESSAGE_LINES = 30  # lines of a failing check's message shown in the report


def _failure(outputs) -> str | None:
    """``ExcType: message`` of a cell's error; for a failed rank, the rank's own last line too.
    A test cell that wrote to stderr fails too (nbgrader gives it no points): say so."""
    for output in outputs:
        if output.get("output_type") != "error":
            continue
        value = str(output.get("evalue", "")).strip()
        lines = [line for line in value.splitlines() if line.strip()]
        head = f"{output.get('ename', 'Error')}: {lines[0] if lines else ''}".rstrip(": ")
        if output.get("ename") == "RankError" and len(lines) > 1:
            return (
                f"{head}\n{lines[-1].strip()}"  # the rank's traceback: its last line is the cause
            )
        return "\n".join([head, *lines[1:MESSAGE_LINES]])  # a check's whole message
    for output in outputs:
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            text = [line for line in str(output.get("text", "")).splitlines() if line.strip()]
            return "\n".join(
                ["the test cell wrote to stderr, which nbgrader counts as a failure:", *text[:5]]
            )
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
    from distlab.grading_resolve import identify as match

    return match(notebook_path, root)


def find_notebook(notebook: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The learner's notebook that ``notebook`` names (a path or a course notebook's name),
    looked for in the current folder first: see :mod:`distlab.grading_resolve`."""
    from distlab.grading_resolve import resolve_notebook

    return resolve_notebook(notebook, root).path


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
    timeout: int | None = None,
) -> NotebookGrade:
    """Autograde one learner notebook in a temporary course directory.

    ``notebook_path``: anything :func:`find_notebook` accepts (a path, or a name).

    ``keep``: a folder to build the course directory in (kept afterwards, for
    inspecting the autograded notebook); default a temporary one, deleted.

    ``progress=True`` shows a progress bar on stderr (on a terminal only) while nbgrader
    builds the course directory and runs the notebook.

    ``timeout``: seconds a cell may run before it is stopped and reported as timed out
    (default: the course config's ``Execute.timeout``).
    """
    from distlab.grading_resolve import resolve_notebook
    from distlab.progress import progress_bar

    found = resolve_notebook(notebook_path, root)
    notebook = found.notebook
    with (
        tempfile.TemporaryDirectory(prefix="distlab-grade-") as tmp,
        progress_bar(f"grading {notebook}", total=3, enabled=progress) as bar,
    ):
        learner = Path(tmp) / "upload" / f"{notebook}.ipynb"
        learner.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(found.path, learner)  # what is graded cannot change while it runs
        modified = _local_time(learner.stat().st_mtime)
        course_dir = Path(keep) if keep else Path(tmp) / "course"
        course_dir.mkdir(parents=True, exist_ok=True)
        bar.step("building a course directory (nbgrader generate_assignment)")
        prepare_course(course_dir, [found.assignment], root)
        bar.advance()
        submit(course_dir, DEFAULT_STUDENT, found.assignment, learner)
        bar.advance()
        bar.step(f"running {notebook} and its tests (nbgrader autograde)")
        autograde(course_dir, found.assignment, DEFAULT_STUDENT, timeout)
        grade = read_grade(course_dir, DEFAULT_STUDENT, found.assignment, notebook)
        bar.advance()
        grade.edited_test_cells = edited_test_cells(learner)
    grade.path = str(found.path)
    grade.modified = modified
    grade.note = found.note
    return grade


def _local_time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


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
    lines = [f"{grade.assignment}: {grade.points:g} / {grade.max_points:g} points"]
    if grade.path:
        lines.append(f"graded {grade.path} (modified {grade.modified})")
    if grade.note:
        lines.append(f"note: {grade.note}")
    if grade.edited_test_cells:
        lines.append(
            f"note: {len(grade.edited_test_cells)} read-only test cell(s) were edited "
            f"({', '.join(grade.edited_test_cells)}); they were graded with the original tests."
        )
    lines += [f"note: {problem}" for problem in grade.problems]
    width = max((len(e.title) for e in grade.exercises), default=0)
    for e in grade.exercises:
        lines += _exercise_lines(e, width, e.grade_id in grade.edited_test_cells)
    suggestions = flashcard_suggestions(grade)
    if suggestions:
        lines.append("Review the topics you missed:")
        for section, n_cards in suggestions:
            count = "" if n_cards is None else f"   ({n_cards} card{'' if n_cards == 1 else 's'})"
            lines.append(f"  flashcards drill --notebook {section}{count}")
    return "\n".join(lines)


def _exercise_lines(e: ExerciseScore, width: int, edited: bool) -> list[str]:
    status = "passed" if e.passed else "FAILED"
    lines = [f"  {e.title:<{width}}  {e.points:g}/{e.max_points:g}  {status}"]
    if edited:
        lines.append("      your copy of this test cell was edited: graded with the original test")
    if e.failure:
        lines.extend(f"      {line}" for line in e.failure.splitlines())
    if e.failure and e.raised_in:
        where = "stopped in" if e.failure.startswith("TimeoutError") else "raised in"
        lines.append(f"      {where} {e.raised_in}()")
    if e.failure and e.flashcards and "#" in e.flashcards:
        lines.append(f"      reread the notebook's section #{e.flashcards.split('#', 1)[1]}")
    return lines


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
        "--keep", metavar="DIR", help="build the course directory in DIR and keep it"
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
    from distlab.grading_run import Interrupted, signals_raise

    try:
        with signals_raise():
            if args.exercise is not None:
                from distlab.grading_slice import grade_exercise

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
    print(json.dumps(_as_json(grade), indent=2) if args.json else format_report(grade))
    return 0 if grade.points >= grade.max_points else 1


def _as_json(grade: NotebookGrade) -> dict:
    return {
        "assignment": grade.assignment,
        "notebook": grade.notebook,
        "path": grade.path,
        "modified": grade.modified,
        "note": grade.note,
        "points": grade.points,
        "max_points": grade.max_points,
        "edited_test_cells": grade.edited_test_cells,
        "problems": grade.problems,
        "exercises": [e.__dict__ for e in grade.exercises],
    }
