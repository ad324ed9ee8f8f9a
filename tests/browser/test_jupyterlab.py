"""What the learner sees in JupyterLab: the course notebooks under Run All, the ring
player's slider and the flashcard drill, in headless Chromium (see conftest.py).

Which notebooks: ``$DISTLAB_BROWSER_NOTEBOOKS`` (comma-separated names, or ``all``); by
default the ones CI runs: 00-launching, 02-collectives (the one with the player), and the
three that hold the newest sections (07's dropout and context parallelism, 08's schedules
beyond ZB-H1, 13's sharded matmuls and overlap timelines).
``python scripts/browser_check.py`` runs every notebook. Screenshots land in out/browser/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from jupyterlab_driver import LabPage, copy_notebooks

from flashcards.store import Store

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "course"
ALL_NOTEBOOKS = sorted(p.name for p in COURSE.iterdir() if any(p.glob("*.ipynb")))
CI_NOTEBOOKS = [
    "00-launching",
    "02-collectives",
    "07-tensor-and-sequence-parallelism",
    "08-pipeline-parallelism",
    "13-sharded-matmuls-and-overlap",
]
NOTEBOOKS_ENV_VAR = "DISTLAB_BROWSER_NOTEBOOKS"
PLAYER_CALL = "ring_all_reduce_player("
WIDGET_TIMEOUT_MS = 60_000
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # 10-40 s a notebook


def selected_notebooks() -> list[str]:
    chosen = os.environ.get(NOTEBOOKS_ENV_VAR, "").strip()
    if not chosen:
        return CI_NOTEBOOKS
    if chosen == "all":
        return ALL_NOTEBOOKS
    names = [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL_NOTEBOOKS))
    if unknown:
        raise ValueError(f"{NOTEBOOKS_ENV_VAR} names {unknown}; course/ has {ALL_NOTEBOOKS}")
    return names


@pytest.mark.parametrize("name", selected_notebooks())
def test_run_all_course_notebook(lab: LabPage, lab_root: Path, name: str):
    copy_notebooks(COURSE, lab_root, [name])
    lab.open(f"{name}/{name}.ipynb")
    stops = lab.run_all()
    cells = lab.report()
    lab.screenshot(f"{name}-after-run-all")

    not_run = [c.index for c in cells if c.source.strip() and c.execution_count is None]
    assert not not_run, f"cells {not_run} never ran"
    errors = [(c.index, e["ename"], e["evalue"]) for c in cells for e in c.errors]
    unexpected = [e for e in errors if not unsolved_exercise(e[1], e[2])]
    assert not unexpected, "errors other than the unsolved exercises':\n" + "\n".join(
        f"cell {index}: {ename}: {evalue}" for index, ename, evalue in unexpected
    )
    stubs = [c.index for c in cells if "raise NotImplementedError" in c.source]
    assert bool(stubs) == bool(errors), f"stub cells {stubs}, errors {errors}"
    assert stops <= len(errors), (stops, errors)

    for c in cells:
        assert c.images_drawn >= c.png_outputs, f"cell {c.index}: a figure was not drawn"
        assert c.widgets_drawn >= c.widget_outputs, f"cell {c.index}: a widget was not drawn"
        assert not c.widget_errors, f"cell {c.index}: {c.widget_errors}"

    ranks_cells = [c for c in cells if c.source.startswith("%%ranks")]
    if ranks_cells:  # %%ranks sections: every rank answered, equal values shown once
        assert any("[ranks 0-3]" in c.text for c in ranks_cells), [c.text for c in ranks_cells]

    if any(PLAYER_CALL in c.source for c in cells):
        check_player_slider_redraws(lab, next(c.index for c in cells if PLAYER_CALL in c.source))
    lab.close_and_shutdown()


def unsolved_exercise(ename: str, evalue: str) -> bool:
    """A stub's NotImplementedError, raised in the kernel or on a rank (``distlab.run``
    reports the first rank that failed)."""
    if ename == "NotImplementedError":
        return True
    return ename == "RankError" and re.match(r"rank \d+ failed with NotImplementedError;", evalue)


def check_player_slider_redraws(lab: LabPage, index: int) -> None:
    """Move the ring player's slider one step with the keyboard; its figure must change."""
    from playwright.sync_api import expect

    cell = lab.cell(index)
    figure = cell.locator(".jupyter-widgets img").first
    expect(figure).to_be_visible(timeout=WIDGET_TIMEOUT_MS)
    before = figure.get_attribute("src")
    lab.screenshot("02-collectives-player-step-0", cell)
    cell.locator(".widget-slider .noUi-handle").first.focus()
    lab.page.keyboard.press("ArrowRight")
    expect(cell.locator(".widget-readout").first).to_have_text("1", timeout=WIDGET_TIMEOUT_MS)
    expect(figure).not_to_have_attribute("src", before, timeout=WIDGET_TIMEOUT_MS)
    lab.screenshot("02-collectives-player-step-1", cell)


DRILL_NOTEBOOK = "02-collectives"


def test_flashcard_drill(lab: LabPage, lab_root: Path, flashcards_db: Path):
    """Show an answer, rate it Good, see the next card and the review in the store, undo."""
    from playwright.sync_api import expect

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNELSPEC  # without one, JupyterLab asks which kernel
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"import flashcards\nflashcards.drill(notebook={DRILL_NOTEBOOK!r})"
        )
    ]
    nbformat.write(nb, lab_root / "drill.ipynb")
    lab.open("drill.ipynb")
    lab.run_all()

    card = lab.page.locator(".distlab-flashcards")
    expect(card).to_be_visible(timeout=WIDGET_TIMEOUT_MS)
    question = card.locator(".widget-htmlmath").first
    first_question = question.text_content()
    assert DRILL_NOTEBOOK in first_question
    lab.screenshot("drill-1-question", card)

    card.get_by_role("button", name="Show answer").click()
    good = card.get_by_role("button", name="Good")
    expect(good).to_be_visible()
    lab.screenshot("drill-2-answer", card)

    good.click()
    expect(card).to_contain_text("reviewed today: 1", timeout=WIDGET_TIMEOUT_MS)
    expect(question).not_to_have_text(first_question)
    lab.screenshot("drill-3-next-card", card)
    with Store(flashcards_db) as store:
        reviews = store.reviews()
    assert [(r.rating.name, r.slug) for r in reviews] == [("Good", reviews[0].slug)]

    card.get_by_role("button", name="Undo").click()
    expect(card).to_contain_text(f"Undid the last review of {reviews[0].slug}")
    expect(card).to_contain_text("reviewed today: 0")
    expect(question).to_have_text(first_question)
    lab.screenshot("drill-4-undone", card)
    with Store(flashcards_db) as store:
        assert store.reviews() == []
    lab.close_and_shutdown()


CHECK_NOTEBOOK, CHECK_TEST = "03-algorithms-and-cost", "test-bandwidths"


def _check_notebook(folder: Path) -> Path:
    """A learner's copy of notebook 03 cut to one exercise (its imports, its solution cell,
    solved, its test cell) with a ``distlab.check()`` cell below the test, saved as
    JupyterLab saves it: the check finds the notebook by this file and the exercise by the
    calling cell's id in it."""
    from distlab.grading.cells import grade_id_of
    from distlab.grading.slicing import needed_cells

    name = CHECK_NOTEBOOK
    released = nbformat.read(COURSE / name / f"{name}.ipynb", as_version=4)
    solved = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    answers = {grade_id_of(c): c.source for c in solved.cells if grade_id_of(c)}
    code = [c for c in released.cells if c.cell_type == "code"]
    test = next(i for i, c in enumerate(code) if grade_id_of(c) == CHECK_TEST)
    cells = [code[i] for i in needed_cells([c.source for c in code], [test])]
    for cell in cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[grade_id_of(cell)]
    check = nbformat.v4.new_code_cell("import distlab\ndistlab.check()")
    released.cells = [*cells, check]
    path = folder / f"{name}.ipynb"
    nbformat.write(released, path)
    return path


def test_distlab_check_in_jupyterlab_scores_the_exercise_above_it(lab: LabPage, lab_root: Path):
    """``distlab.check()`` with no argument, run from JupyterLab: the kernel's file comes
    from the session JupyterLab starts, the exercise from the cell id JupyterLab sends
    with the request. The solved exercise earns its points; after the solution cell is
    edited to a plausible wrong answer (algbw reported as busbw) and run again, the
    same check cell gives 0 and says why."""
    folder = lab_root / "check-work"
    folder.mkdir()
    _check_notebook(folder)
    lab.open(f"check-work/{CHECK_NOTEBOOK}.ipynb")
    lab.run_all()
    check = lab.report()[-1]
    assert not check.errors, check
    assert f"{CHECK_NOTEBOOK}, exercise 3 (" in check.text and "2 / 2 points" in check.text, check
    lab.screenshot("check-solved", lab.cell(check.index))

    solution = next(c for c in lab.report() if "def bandwidths" in c.source)
    wrong = solution.source.replace("2 * (n - 1) / n", "1", 1)
    assert wrong != solution.source, "the mutant must change the solution"
    lab.page.evaluate(
        "([i, text]) => window.jupyterapp.shell.currentWidget.content.widgets[i]"
        ".model.sharedModel.setSource(text)",
        [solution.index, wrong],
    )
    for index in (solution.index, check.index):
        lab.page.evaluate(
            "([id, i]) => { window.jupyterapp.shell.activateById(id);"
            " window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }",
            [lab.panel_id, index],
        )
        lab.page.evaluate(
            "async () => await window.jupyterapp.commands.execute('notebook:run-cell')"
        )
        lab.page.evaluate("async (t) => { const nb = window.jupyterapp.shell.currentWidget"
                          ".content; await window.galata.waitForCellRun(nb.widgets[nb.activeCellIndex], t); }",
                          120_000)  # fmt: skip
    rechecked = lab.report()[-1]
    assert "0 / 2 points" in rechecked.text, rechecked
    lab.screenshot("check-wrong-answer", lab.cell(check.index))
    lab.close_and_shutdown()
