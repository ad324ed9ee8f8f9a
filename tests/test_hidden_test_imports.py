"""The cells nbgrader restores from the release import what they use themselves (issue 36 §2).

``nbgrader autograde`` runs the learner's copy with every test cell (hidden tests put back)
and every read-only cell taken from the *current* release, but every other cell as the
learner's copy has it. A copy made from an older release has an older import cell: a test
that relies on ``withheld`` or ``one_f_one_b`` being imported there fails with a NameError
(08 solved before the last course update scored 0/7). So each restored cell (a graded test
cell, or a read-only helper such as ``check_ddp``) imports every name it reads that another
cell binds only by an import. The learner's exercise functions are what is tested and come
from the copy; so do demo variables, but a hidden test reads none that its visible part does
not read already.

Static: :func:`distlab.grading.slicing.cell_names` reads each cell; no kernel runs.
"""

from __future__ import annotations

import nbformat
import pytest

from distlab.core.course import assignment_names, find_course_root, source_notebooks
from distlab.grading.cells import HIDDEN_MARK, grade_id_of, is_graded, is_restored, is_solution
from distlab.grading.slicing import cell_names

ROOT = find_course_root()
NOTEBOOKS = [p for a in assignment_names(ROOT) for p in source_notebooks(ROOT, a)]
HIDDEN, END = HIDDEN_MARK, "### END HIDDEN TESTS"


def imported_elsewhere(nb) -> list[str]:
    """'cell <grade id>: <name> (imported by <cell ids>)' for each name a restored cell reads
    that other cells bind only by an import."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    names = {id(c): cell_names(c.source) for c in code}
    found = []
    for cell in filter(is_restored, code):
        own = names[id(cell)]
        for name in sorted(own.uses - own.defines):
            binders = [c for c in code if c is not cell and name in names[id(c)].defines]
            if binders and all(name in names[id(c)].imports for c in binders):
                where = ", ".join(str(c.get("id")) for c in binders)
                found.append(f"cell {grade_id_of(cell)}: {name} (imported by {where})")
    return found


def demo_names_only_hidden_tests_read(nb) -> list[str]:
    """'cell <grade id>: <name> (from <cell id>)' for each name a hidden test reads that its
    visible part does not, bound by a cell the learner's copy keeps (not a restored cell,
    not an exercise)."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    kept = [c for c in code if not is_restored(c) and not is_solution(c)]
    found = []
    for cell in code:
        if not is_graded(cell) or HIDDEN not in cell.source:
            continue
        visible, _, rest = cell.source.partition(HIDDEN)
        seen, hidden = cell_names(visible), cell_names(rest.partition(END)[0])
        for name in sorted(hidden.uses - hidden.defines - seen.uses - seen.defines):
            source = next((c for c in kept if name in cell_names(c.source).defines), None)
            if source is not None:
                found.append(f"cell {grade_id_of(cell)}: {name} (from {source.get('id')})")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_restored_cells_import_what_they_use(path):
    nb = nbformat.read(path, as_version=4)
    missing = imported_elsewhere(nb)
    assert not missing, (
        f"{path.relative_to(ROOT)}: a test or read-only cell reads a name that only another "
        "cell's import binds; import it in that cell (a copy from an older release may not "
        "import it):\n  " + "\n  ".join(missing)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_hidden_tests_read_no_demo_variable_the_visible_test_does_not(path):
    nb = nbformat.read(path, as_version=4)
    extra = demo_names_only_hidden_tests_read(nb)
    assert not extra, (
        f"{path.relative_to(ROOT)}: a hidden test reads a name from a demo cell that the "
        "learner's copy may define otherwise (or not at all); build it in the test:\n  "
        + "\n  ".join(extra)
    )


def test_the_checks_find_what_they_look_for():
    """A test cell that uses ``withheld`` from the import cell, and a demo variable only in its
    hidden part, is named; the same cell importing it and building the value is not."""
    imports = nbformat.v4.new_code_cell("from distlab.withheld import withheld\nH = 3600")
    solution = nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1")
    solution.metadata["nbgrader"] = {"solution": True, "grade_id": "f"}
    test = nbformat.v4.new_code_cell(
        f"with withheld(len):\n    assert f() == 1\n{HIDDEN}\nassert H * f() == 3600\n{END}"
    )
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "test-f", "locked": True}
    imports.id, nb = "code-01", nbformat.v4.new_notebook(cells=[imports, solution, test])
    assert imported_elsewhere(nb) == ["cell test-f: withheld (imported by code-01)"]
    assert demo_names_only_hidden_tests_read(nb) == ["cell test-f: H (from code-01)"]
    test.source = (
        "from distlab.withheld import withheld\n\nwith withheld(len):\n    assert f() == 1\n"
        f"{HIDDEN}\nH = 3600\nassert H * f() == 3600\n{END}"
    )
    assert imported_elsewhere(nb) == [] and demo_names_only_hidden_tests_read(nb) == []
