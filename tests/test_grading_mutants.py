"""Grading that only understanding passes (issue 24): plausible wrong answers lose points,
every check says what was wrong, and one exercise grades alone, as the whole notebook does.

* The mutation suite: for every notebook with a ``tests/mutants/mNN_*.py`` module, the
  solution of each exercise passes (before and after the mutants ran in the same kernel),
  the released stub fails, and every mutant fails at least one test cell that uses it.
* The message check: no graded test cell has an ``assert`` without a message, or an
  ``assert_close`` without ``msg=``.
* ``distlab grade NB --exercise K`` from a work folder: a solved copy earns the exercise's
  points, the released copy none, as the whole-notebook grade does.
* ``distlab.check`` (issue 42) against ``distlab grade --exercise``: for one exercise of
  each compared notebook, the check, run in the mutation suite's kernel after each variant,
  gives the points the exercise grade gives the learner's file with that variant.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from distlab import grading
from distlab.core.course import released_notebook, source_notebook
from distlab.grading.cells import grade_id_of, is_graded
from distlab.grading.exercise import choose_tests, grade_exercises
from distlab.grading.mutants import (
    CORRECT,
    check_cell,
    check_notebook,
    check_result,
    load_module,
    mutant_source,
    plan,
)
from distlab.grading.slicing import cell_names, needed_cells
from distlab.launch.template import hosting

ROOT = grading.find_course_root()
MUTANT_FILES = sorted((ROOT / "tests" / "mutants").glob("m[0-9][0-9]_*.py"))
NOTEBOOKS = [
    (a, nb) for a in grading.assignment_names(ROOT) for nb in grading.source_notebooks(ROOT, a)
]
# Notebooks whose test cells still have bare asserts (none left); each entry is an
# xfail(strict) so that finishing one fails the test until it is removed from this set.
MESSAGES_NOT_YET: set[str] = {
}  # fmt: skip

pytestmark = pytest.mark.timeout(1800)


def _solution_ids(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [
        c.metadata["nbgrader"]["grade_id"]
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"
    ]


@pytest.mark.parametrize("mutants", MUTANT_FILES, ids=lambda p: p.stem)
def test_every_solution_cell_has_three_mutants(mutants):
    module = load_module(mutants)
    path = ROOT / "solutions" / module.ASSIGNMENT / f"{module.ASSIGNMENT}.ipynb"
    for solution_id in _solution_ids(path):
        assert len(module.MUTANTS.get(solution_id, [])) >= 3, f"{solution_id}: fewer than 3"


# ------------------------------------- the check against distlab grade --exercise ---
#: Exercises left out of the check's comparison, and why.
NOT_COMPARED = {
    "idle-share": "its test measures idle time on real processes: on a loaded machine the "
    "grade and the check can disagree on timing alone (seen: the grade measured 57.7 % "
    "idle against the formula's 27.3 %, at load 7 on 2 cores, and failed the solution)",
}

#: The notebooks whose check is compared in the suite: the kinds of exercise there are (on
#: real processes: 00; a collective with the library's withheld: 02; numbers in one
#: process: 03; the newest material: 13). Each comparison grades 5-6 copies with
#: ``distlab grade --exercise`` (about 10 s of CPU each); all 14 were compared once when
#: the check was written (13 equal; 08's idle-share, see NOT_COMPARED, disagreed on timing
#: and 08 was then compared on another exercise, equal), and
#: ``DISTLAB_CHECK_EVERY_NOTEBOOK=1 pytest tests/test_grading_mutants.py`` compares them all.
CHECK_COMPARED = ("m00_launching", "m02_collectives", "m03_algorithms_and_cost",
                  "m13_sharded_matmuls_and_overlap")  # fmt: skip
EVERY_NOTEBOOK = os.environ.get("DISTLAB_CHECK_EVERY_NOTEBOOK") == "1"


def _compared(mutants: Path) -> bool:
    return EVERY_NOTEBOOK or mutants.stem in CHECK_COMPARED


def _compared_exercise(module, source) -> str:
    """The notebook's solution cell whose check is compared: the one with the fewest mutants
    (ties: the first), of those not in :data:`NOT_COMPARED`."""
    order = [
        grade_id_of(c)
        for c in source.cells
        if grade_id_of(c) in module.MUTANTS and grade_id_of(c) not in NOT_COMPARED
    ]
    return min(order, key=lambda solution_id: len(module.MUTANTS[solution_id]))


@pytest.fixture(scope="module")
def mutation_run(tmp_path_factory):
    """The mutation check of one notebook (:func:`check_notebook`), run once per test run
    and shared by the tests below; for a compared notebook the kernel also runs
    :func:`~distlab.grading.mutants.check_cell` (the learner's ``distlab.check``,
    not recorded) after each variant of :func:`_compared_exercise`."""
    done: dict[Path, dict] = {}

    def run(mutants: Path) -> dict:
        if mutants not in done:
            after = {}
            if _compared(mutants):
                module = load_module(mutants)
                source = nbformat.read(source_notebook(ROOT, module.ASSIGNMENT), as_version=4)
                solution_id = _compared_exercise(module, source)
                the_plan = plan(source, solution_id)
                test_id = grade_id_of(the_plan.cells[the_plan.tests[0]])
                after[solution_id] = check_cell(test_id, module.ASSIGNMENT)
            cwd = str(tmp_path_factory.mktemp(mutants.stem))
            done[mutants] = check_notebook(ROOT, mutants, cwd, after)
        return done[mutants]

    with hosting():  # one kernel per notebook: their starters fork from one template
        yield run


@pytest.mark.slow
@pytest.mark.parametrize("mutants", MUTANT_FILES, ids=lambda p: p.stem)
def test_plausible_wrong_answers_lose_points(mutants, mutation_run):
    problems = []
    for solution_id, verdicts in mutation_run(mutants).items():
        solution, stub, *others, again = verdicts
        if solution.caught or again.caught:
            problems.append(
                f"{solution_id}: the solution fails: {solution.messages or again.messages}"
            )
        if not stub.caught:
            problems.append(f"{solution_id}: the released stub earns full marks")
        problems += [
            f"{solution_id}: earns full marks: {v.variant}"
            for v in others
            if not v.caught and not v.variant.startswith(CORRECT)
        ]
        problems += [
            f"{solution_id}: a correct answer loses points: {v.variant}: {v.messages}"
            for v in others
            if v.caught and v.variant.startswith(CORRECT)
        ]
    assert not problems, "\n".join(problems)


def _silent_asserts(source: str) -> list[str]:
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and node.msg is None:
            found.append(f"line {node.lineno}: assert {ast.unparse(node.test)[:60]}")
        is_close = isinstance(node, ast.Call) and ast.unparse(node.func).endswith("assert_close")
        if is_close and not any(k.arg == "msg" for k in node.keywords):
            found.append(f"line {node.lineno}: assert_close without msg=")
    return found


@pytest.mark.parametrize(
    "assignment,name",
    [
        pytest.param(a, n, marks=pytest.mark.xfail(strict=True, reason="not converted yet"))
        if a in MESSAGES_NOT_YET
        else (a, n)
        for a, n in NOTEBOOKS
    ],
)
def test_every_check_says_what_was_wrong(assignment, name):
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{name.stem}.ipynb", as_version=4)
    silent = {
        c.metadata["nbgrader"]["grade_id"]: _silent_asserts(c.source)
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"
    }
    silent = {k: v for k, v in silent.items() if v}
    assert not silent, silent


def test_the_slice_keeps_definers_and_setup_and_drops_demos():
    cells = [
        "import math\nimport torch",  # 0: imports
        "torch.manual_seed(0)",  # 1: setup, always kept
        "N = 8",  # 2: shadowed by 5
        "demo = distlab.run(slow, 4)",  # 3: a demo nobody uses
        "for k in range(3):\n    print(k)",  # 4: binds k, not N
        "N = 16",  # 5
        "def f(x):\n    return math.sqrt(x) * N",  # 6
        "assert f(4) == 2 * N, 'f'",  # 7: the test
    ]
    assert needed_cells(cells, [7]) == [0, 1, 5, 6, 7]
    names = cell_names("for n in (1, 2):\n    y = n\nprint(y, z)\n[w for w in v]\nq += 1")
    assert names.uses == {"print", "z", "v", "q"} and {"n", "y", "q"} <= names.defines


def test_a_name_bound_inside_a_nested_function_is_not_read_from_the_notebook():
    """Python's scopes: ``rank`` and ``worker`` below belong to the functions, so the cells
    that bind them at the top level (demos that loop over ranks) are not pulled in."""
    cells = [
        "for rank in range(4):\n    print(rank)",  # 0: a demo
        "for worker in (1, 2):\n    print(worker)",  # 1: another
        "K = 3",  # 2
        "def check(n):\n    def worker(rank, ws):\n        return rank + K\n    return run(worker, n)",
        "class Probe:\n    K = 0\n    def value(self):\n        return K",  # 4: the global K
        "assert check(2) and Probe().value() == 3, 'checked'",  # 5: the test
    ]
    assert needed_cells(cells, [5]) == [2, 3, 4, 5]
    names = cell_names("def f(x=A):\n    import math\n    return [y + B for y in C] + [math]")
    assert names.uses == {"A", "B", "C"}


def test_a_stubs_annotations_and_an_except_name_are_read_as_python_reads_them():
    """A stub ``def f(model: nn.Module)`` needs ``nn`` where it is defined, though its body only
    raises; ``except E as error`` binds ``error`` in the cell, which reads no notebook ``error``.
    (A test cell that imports what it uses no longer pulls the import cell in for the stub.)"""
    cells = [
        "import torch\nfrom torch import nn",  # 0: the import cell
        "error = 'a demo variable'",  # 1
        "def f(model: nn.Module) -> torch.Tensor:\n    raise NotImplementedError()",  # 2: a stub
        "from torch import nn\ntry:\n    f(nn.Linear(1, 1))\n"  # 3: the test
        + "except NotImplementedError as error:\n    raise AssertionError(error)",
    ]
    assert needed_cells(cells, [3]) == [0, 2, 3]
    assert cell_names("x: Size = 1").uses == {"Size"}


def test_exercise_choice_names_the_choices():
    source = nbformat.read(
        ROOT / "solutions" / "03-algorithms-and-cost" / "03-algorithms-and-cost.ipynb",
        as_version=4,
    )
    assert choose_tests(source, 3) == choose_tests(source, "test-bandwidths")
    assert choose_tests(source, "algbw") == ["test-bandwidths"]
    with pytest.raises(ValueError, match="1: test-ring-all-reduce-time"):
        choose_tests(source, 9)


@pytest.mark.slow
@pytest.mark.parametrize("which,points,code", [("solutions", "2 / 2", 0), ("course", "0 / 2", 1)])
def test_grade_one_exercise_from_a_work_folder(tmp_path, which, points, code):
    name = "03-algorithms-and-cost"
    shutil.copy(ROOT / which / name / f"{name}.ipynb", tmp_path / f"{name}.ipynb")
    done = subprocess.run(
        [sys.executable, "-m", "distlab.cli", "grade", "03", "--exercise", "algbw"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr
    assert f"{name}: {points} points" in done.stdout, done.stdout
    assert str(tmp_path / f"{name}.ipynb") in done.stdout
    assert "algbw and busbw" in done.stdout and "Ring" not in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mutants", [p for p in MUTANT_FILES if _compared(p)], ids=lambda p: p.stem)
def test_the_check_gives_the_points_distlab_grade_exercise_gives(mutants, mutation_run, tmp_path):
    """For the solution, the released stub and every mutant of one exercise: the check's
    points in the learner's kernel equal ``distlab grade --exercise``'s on the learner's file
    (a fresh kernel, the cut-down notebook), and the check gives less than full points
    exactly to the variants whose test cell raised in the mutation suite's run before it."""
    module = load_module(mutants)
    name = module.ASSIGNMENT
    source = nbformat.read(source_notebook(ROOT, name), as_version=4)
    released_path = released_notebook(ROOT, name)
    released = nbformat.read(released_path, as_version=4)
    solution_id = _compared_exercise(module, source)
    the_plan = plan(source, solution_id)
    test_id = grade_id_of(the_plan.cells[the_plan.tests[0]])
    solution = the_plan.cells[the_plan.solution].source
    stub = next(c.source for c in released.cells if grade_id_of(c) == solution_id)
    variants = [("solution", solution), ("stub", stub)]
    variants += [
        (what, mutant_source(solution, change)) for what, change in module.MUTANTS[solution_id]
    ]
    solved = {grade_id_of(c): c.source for c in source.cells if grade_id_of(c) and not is_graded(c)}

    learners = []  # distlab grade --exercise, on the learner's file with each variant
    for index, (_, variant) in enumerate(variants):
        nb = nbformat.read(released_path, as_version=4)
        for cell in nb.cells:
            if grade_id_of(cell) in solved and cell.metadata["nbgrader"].get("solution"):
                cell.source = (
                    variant if grade_id_of(cell) == solution_id else solved[grade_id_of(cell)]
                )
        work = tmp_path / f"work-{index}"  # a copy of the learner's folder per variant
        shutil.copytree(released_path.parent, work, ignore=shutil.ignore_patterns("*.ipynb"))
        learner = work / f"{name}.ipynb"
        nbformat.write(nb, learner)
        learners.append(learner)
    # each in a fresh kernel, as ``distlab grade --exercise`` runs it (one child drives them)
    grades = grade_exercises([(learner, test_id) for learner in learners])
    graded = {
        what: (grade.exercises[0].points, grade.exercises[0].failure)
        for (what, _), grade in zip(variants, grades, strict=True)
    }

    verdicts = {v.variant: v for v in mutation_run(mutants)[solution_id]}
    checked = {}
    for what, _ in variants:
        result = check_result(verdicts[what].after)
        checked[what] = (result["points"], result["failure"])
        most = float(the_plan.cells[the_plan.tests[0]].metadata["nbgrader"]["points"])
        lost = result["points"] < most
        assert lost == (test_id in verdicts[what].failed), f"{what}: {result}, {verdicts[what]}"

    differ = [
        f"{what}: grade {graded[what][0]:g} ({_first(graded[what][1])}), "
        f"check {checked[what][0]:g} ({_first(checked[what][1])})"
        for what, _ in variants
        if graded[what][0] != checked[what][0]
    ]
    assert not differ, f"{name} {test_id}:\n" + "\n".join(differ)
    assert graded["solution"][0] > 0 and graded["stub"][0] == 0


def _first(failure: str | None) -> str:
    return textwrap.shorten(failure.splitlines()[0], 100) if failure else "passed"


def test_a_name_a_test_cell_imports_does_not_depend_on_the_solution():
    """A test cell that imports what it uses (issue 36 §2) passes nothing on: the later
    cells that use the imported names run once, not for every mutant (08's Exercise 1 had
    its multi-process bubble measurement rerun per mutant: 20 s became 109 s)."""
    from distlab.grading.mutants import depends_on

    cells = [
        "import math",  # 0
        "def f(x):\n    return x + 1",  # 1: the solution
        "from math import sqrt\nassert f(1) == 2, 'f'",  # 2: its test, importing sqrt
        "y = sqrt(4)",  # 3: a later demo using the imported name only
        "z = f(y)",  # 4: uses the solution
    ]
    assert depends_on(cells, 1) == {2, 4}
