"""The course notebooks, graded by nbgrader exactly as an instructor (or `distlab grade`) would.

One temporary course directory serves the whole module: the source notebooks of
``solutions/`` are released there with ``nbgrader generate_assignment``; two
students submit, "solution" (the source notebooks, solutions filled in) and
"untouched" (the released notebooks as a learner receives them); one
``nbgrader autograde`` call grades everything. Nothing is written into the repo.
"""

from __future__ import annotations

import functools
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from distlab import grading
from distlab.site import executed, stated_numbers
from flashcards.course_order import notebook_sections

ROOT = grading.find_course_root()
ASSIGNMENTS = grading.assignment_names(ROOT)
NOTEBOOKS = [(a, nb.stem) for a in ASSIGNMENTS for nb in grading.source_notebooks(ROOT, a)]
REGENERATE = 'nbgrader generate_assignment "*" --create --force'
# Issue 11: notebook 04 with only Exercise 2 solved must earn Exercise 2's points; its test
# builds BucketDDP with the reference bucket assignment instead of Exercise 1's.
PARTIAL_ASSIGNMENT, PARTIAL_NOTEBOOK = "04-data-parallelism", "04-data-parallelism"
PARTIAL_SOLVED, PARTIAL_SCORED = {"bucket-ddp"}, "test-bucket-ddp"

# Bounded by the work, not the wall clock: nbgrader stops any cell that runs past its
# Execute.timeout (nbgrader_config.py) and goes on, so the course fixture ends after a fixed
# number of bounded cells however loaded the machine is. A fixed 900 s for the whole course
# failed every course test on a machine at load 15-35.
pytestmark = pytest.mark.timeout(0)


@functools.cache  # 405 per-cell tests read the same 28 notebooks: once each, not 810 times
def _code_cells(path: Path) -> list:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


SOLUTION_CELLS = [  # (assignment, notebook, code cell index): one nbval-style test per cell
    (a, n, i)
    for a, n in NOTEBOOKS
    for i in range(len(_code_cells(ROOT / "solutions" / a / f"{n}.ipynb")))
]


@pytest.fixture(scope="module")
def course(tmp_path_factory, request) -> Path:
    """The course graded by nbgrader; the solutions as they ran are kept in pytest's cache
    (``.pytest_cache/d/executed-notebooks``) for ``distlab site build``, which shows their
    outputs instead of running the notebooks again (:mod:`distlab.site.executed`)."""
    course_dir = tmp_path_factory.mktemp("course")
    grading.prepare_course(course_dir)
    for assignment, name in NOTEBOOKS:
        notebook = f"{name}.ipynb"
        grading.submit(
            course_dir, "solution", assignment, ROOT / "solutions" / assignment / notebook
        )
        grading.submit(
            course_dir, "untouched", assignment, course_dir / "course" / assignment / notebook
        )
    partial = tmp_path_factory.mktemp("partial") / f"{PARTIAL_NOTEBOOK}.ipynb"
    _solve_only(PARTIAL_SOLVED, course_dir / "course" / PARTIAL_ASSIGNMENT / partial.name, partial)
    grading.submit(course_dir, "partial", PARTIAL_ASSIGNMENT, partial)
    grading.autograde(course_dir)
    if getattr(request.config, "cache", None) is not None:  # None under -p no:cacheprovider
        keep = request.config.cache.mkdir(executed.PYTEST_CACHE_KEY)
        executed.store(course_dir / "autograded" / "solution", keep, ROOT)
    return course_dir


def _solve_only(grade_ids: set[str], released: Path, out: Path) -> None:
    """A copy of a released notebook with only the solution cells ``grade_ids`` filled in."""
    nb = nbformat.read(released, as_version=4)
    source = nbformat.read(ROOT / "solutions" / released.parent.name / released.name, as_version=4)
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells if _solution(c)}
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in grade_ids:
            cell.source = solved[grade_id]
    nbformat.write(nb, out)


def _solution(cell) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("solution"))


def _cells(path: Path) -> list[tuple]:
    """What a released notebook consists of, without volatile fields (outputs, counts): its
    cells, and the release it records (``metadata.distlab``, see distlab.grading.release)."""
    nb = nbformat.read(path, as_version=4)
    cells = [(c.cell_type, c.get("id"), c.source, dict(c.metadata)) for c in nb.cells]
    return [*cells, ("release", None, None, nb.metadata.get("distlab"))]


def _graded(nb) -> list:
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


# ------------------------------------------------------------ static checks ---
def test_there_are_notebooks():
    assert {"00-launching", "01-memory-anatomy", "02-collectives"} <= set(ASSIGNMENTS)


@pytest.mark.parametrize("assignment,name", NOTEBOOKS)
def test_every_exercise_has_solution_visible_and_hidden_tests(assignment, name):
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{name}.ipynb", as_version=4)
    assert "After this notebook you can" in nb.cells[0].source, "open with what the learner can do"
    solutions = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    tests = _graded(nb)
    assert solutions and len(tests) == len(solutions), "one graded test cell per solution cell"
    for cell in solutions:
        assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
    for cell in tests:
        meta = cell.metadata["nbgrader"]
        assert meta["points"] > 0 and meta["locked"], meta["grade_id"]
        visible, _, hidden = cell.source.partition("### BEGIN HIDDEN TESTS")
        checks = ("assert", "expect(", "expect_close(")  # distlab.withheld's checks count
        assert any(c in visible for c in checks), f"{meta['grade_id']}: no visible test"
        hidden_code, end, _ = hidden.partition("### END HIDDEN TESTS")
        assert end and hidden_code.strip(), f"{meta['grade_id']}: no hidden test"
        assert cell.metadata["distlab"]["exercise"], meta["grade_id"]
        assert cell.metadata["distlab"]["flashcards"].startswith(f"{assignment}#"), meta["grade_id"]


@pytest.mark.parametrize(
    "path",
    [ROOT / d / a / f"{n}.ipynb" for d in ("solutions", "course") for a, n in NOTEBOOKS],
    ids=lambda p: f"{p.parent.parent.name}/{p.stem}",
)
def test_notebook_stores_the_metadata_the_kernel_writes(path):
    """JupyterLab marks a notebook "unsaved" as soon as the kernel's ``language_info`` differs
    from the stored one; store what ipykernel writes (the Python ``version`` may differ between
    environments, so only its form is checked)."""
    from ipykernel.ipkernel import IPythonKernel

    meta = nbformat.read(path, as_version=4).metadata
    assert meta.get("kernelspec", {}).get("name") == "python3", meta.get("kernelspec")
    written = dict(IPythonKernel.language_info)
    stored = dict(meta.get("language_info", {}))
    assert re.fullmatch(r"3\.\d+\.\d+", str(stored.pop("version", ""))), meta["language_info"]
    written.pop("version")
    assert stored == written, f"{path}: language_info {stored} is not what the kernel writes"


@pytest.mark.parametrize("assignment,name", NOTEBOOKS)
def test_released_notebook_hides_solutions_and_hidden_tests(assignment, name):
    released = ROOT / "course" / assignment / f"{name}.ipynb"
    assert released.is_file(), f"{released} missing: run `{REGENERATE}`"
    nb = nbformat.read(released, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text
    stubs = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert stubs and all("raise NotImplementedError" in c.source for c in stubs)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


def test_flashcard_sections_match_notebook_headings():
    """Every deck card that points into one of these notebooks names a heading that exists,
    and every exercise's review section has cards."""
    flashcards_model = pytest.importorskip("flashcards.model")
    deck = flashcards_model.load_deck()
    sections = {}
    for assignment, name in NOTEBOOKS:
        path = ROOT / "solutions" / assignment / f"{name}.ipynb"
        nb = nbformat.read(path, as_version=4)
        sections[assignment] = set(notebook_sections(path))  # slugs as the deck writes them
        for cell in _graded(nb):
            anchor = cell.metadata["distlab"]["flashcards"]
            assert deck.filter(notebook=anchor), f"no flashcards for {anchor}"
    for card in deck.cards:
        folder, _, section = card.notebook.partition("#")
        if folder in sections and section:
            assert section in sections[folder], (
                f"card {card.slug}: no heading '{section}' in {folder}"
            )


# ----------------------------------------------------------- nbgrader runs ---
@pytest.mark.slow
def test_course_directory_is_up_to_date(course):
    """course/ is exactly what generate_assignment makes from solutions/ today."""
    released = sorted(p.relative_to(ROOT / "course") for p in (ROOT / "course").glob("*/*.ipynb"))
    expected = sorted(
        p.relative_to(course / "course") for p in (course / "course").glob("*/*.ipynb")
    )
    assert released == expected, f"course/ has other notebooks than solutions/: run `{REGENERATE}`"
    for relative in expected:
        assert _cells(ROOT / "course" / relative) == _cells(course / "course" / relative), (
            f"course/{relative} is out of date with solutions/: run `{REGENERATE}`"
        )


@pytest.mark.slow
@pytest.mark.parametrize("assignment,name", NOTEBOOKS)
def test_solution_scores_full_marks(course, assignment, name):
    grade = grading.read_grade(course, "solution", assignment, name)
    failures = [f"{e.title}: {e.failure}" for e in grade.exercises if not e.passed]
    assert not failures, "\n".join(failures)
    assert grade.points == grade.max_points > 0


@pytest.mark.slow
@pytest.mark.parametrize("assignment,name", NOTEBOOKS)
def test_solution_runs_without_errors(course, assignment, name):
    """No cell of a solution notebook raises, in the execution nbgrader graded."""
    for cell in _executed_solution(course, assignment, name):
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        assert not errors, (
            f"{cell.source[:80]!r} raised {errors[0].ename}: {errors[0].evalue[:300]}"
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "assignment,name,index", SOLUTION_CELLS, ids=[f"{n}-Cell {i}" for _, n, i in SOLUTION_CELLS]
)
def test_solution_cell_runs(course, assignment, name, index):
    """What ``pytest --nbval-lax solutions/`` checks, one test per code cell, read from the
    execution the course fixture already made (each notebook runs once per test run, not
    once for nbval and again for nbgrader): code cell ``index`` of the solution notebook ran
    and raised nothing. The executed cell must be the source's cell (nbgrader ran exactly
    the notebook in ``solutions/``)."""
    executed = _executed_solution(course, assignment, name)
    source = _code_cells(ROOT / "solutions" / assignment / f"{name}.ipynb")
    assert len(executed) == len(source), f"{name}: the graded copy has other code cells"
    cell = executed[index]
    assert cell.source == source[index].source, f"{name} cell {index}: not the source's cell"
    assert cell.get("execution_count"), f"{name} cell {index} never ran (the kernel stopped)"
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    assert not errors, (
        f"{name} cell {index} ({cell.source[:80]!r}) raised {errors[0].ename}: "
        f"{errors[0].evalue[:300]}\n" + "\n".join(errors[0].get("traceback", []))[-3000:]
    )


def _executed_solution(course: Path, assignment: str, name: str) -> list:
    """The code cells of the solution notebook as nbgrader executed them."""
    return _code_cells(course / "autograded" / "solution" / assignment / f"{name}.ipynb")


@pytest.mark.slow
@pytest.mark.parametrize("assignment,name", NOTEBOOKS)
def test_untouched_notebook_runs_to_the_end_and_scores_zero(course, assignment, name):
    nb = nbformat.read(
        course / "autograded" / "untouched" / assignment / f"{name}.ipynb", as_version=4
    )
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "the kernel stopped before the last cell"
    stray = [  # Run All may stop only in exercises and their tests (issue 27)
        c.source[:80]
        for c in code
        if any(o.output_type == "error" for o in c.get("outputs", []))
        and not (_solution(c) or c.metadata.get("nbgrader", {}).get("grade"))
    ]
    assert not stray, f"cells outside the exercises raise in the released notebook: {stray}"
    grade = grading.read_grade(course, "untouched", assignment, name)
    assert grade.max_points > 0
    for exercise in grade.exercises:
        assert exercise.points == 0, f"{exercise.title} scores without a solution"
        assert exercise.failure and "NotImplementedError" in exercise.failure, exercise.failure


@pytest.mark.slow
def test_partial_solution_earns_its_exercises_points(course):
    grade = grading.read_grade(course, "partial", PARTIAL_ASSIGNMENT, PARTIAL_NOTEBOOK)
    scores = {e.grade_id: (e.points, e.max_points, e.failure) for e in grade.exercises}
    points, max_points, failure = scores.pop(PARTIAL_SCORED)
    assert points == max_points > 0, f"{PARTIAL_SCORED} scores {points}/{max_points}: {failure}"
    assert all(p == 0 for p, _, _ in scores.values()), f"unsolved exercises score: {scores}"


@pytest.mark.slow
@pytest.mark.parametrize("assignment,name", NOTEBOOKS[:1])
def test_edited_test_cell_is_detected(course, tmp_path, assignment, name):
    released = course / "course" / assignment / f"{name}.ipynb"
    untouched = tmp_path / "untouched.ipynb"
    shutil.copy(released, untouched)
    assert grading.edited_test_cells(untouched) == []
    nb = nbformat.read(released, as_version=4)
    test_cell = _graded(nb)[0]
    test_cell.source = "assert True  # the tests are gone"
    tampered = tmp_path / "tampered.ipynb"
    nbformat.write(nb, tampered)
    assert grading.edited_test_cells(tampered) == [test_cell.metadata["nbgrader"]["grade_id"]]


@pytest.mark.slow
@pytest.mark.parametrize("assignment,name", NOTEBOOKS)
def test_every_stated_number_is_checked(course, assignment, name):
    """Every number the notebook's prose states is tied, printed by (or written in) a code
    cell of its section, or cited with its section, read from the execution graded above
    (``tests/test_stated_numbers.py`` checks the ties without outputs)."""
    source = nbformat.read(ROOT / "solutions" / assignment / f"{name}.ipynb", as_version=4)
    ran = course / "autograded" / "solution" / assignment / f"{name}.ipynb"
    report = stated_numbers.check_notebook(source, name, nbformat.read(ran, as_version=4))
    assert not report.count("unchecked") and not report.tie_problems, stated_numbers.table([report])
