"""The site build's pieces (distlab.site): outputs onto the released notebook, the executed
copies it reuses, the deck and library pages, the box on each page, and the heading anchors.

The whole site in a browser is tests/browser/test_site_pages.py."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from distlab import cli, grading
from distlab.site import api, deck, executed, pages
from flashcards.cli import build_parser as flashcards_parser
from flashcards.course_order import notebook_sections, section_anchor
from flashcards.model import load_deck

ROOT = grading.find_course_root()
ASSIGNMENTS = grading.assignment_names(ROOT)
TEST_DECK = Path(__file__).parent / "data" / "deck"


def _nbgrader(grade_id: str, *, solution=False, grade=False) -> dict:
    return {"nbgrader": {"grade_id": grade_id, "solution": solution, "grade": grade}}


def _pair():
    """A tiny source notebook as it ran, and its release: title, demo, stub, test, demo."""
    ran = new_notebook(
        cells=[
            new_markdown_cell("# 99 · Tiny\n\n## Ring all-reduce", id="intro"),
            new_code_cell("print(2 + 2)", id="demo", execution_count=1),
            new_code_cell(
                "def add(a, b):\n    return a + b",
                id="stub",
                metadata=_nbgrader("ex", solution=True),
            ),
            new_code_cell(
                "assert add(1, 2) == 3\n### BEGIN HIDDEN TESTS\nassert add(0, 0) == 0",
                id="test",
                metadata=_nbgrader("test-ex", grade=True),
            ),
            new_code_cell("print(add(1, 2))", id="uses-exercise", execution_count=4),
        ]
    )
    ran.cells[1].outputs = [new_output("stream", name="stdout", text="4\n")]
    ran.cells[2].outputs = [new_output("stream", name="stdout", text="solution printed\n")]
    ran.cells[3].outputs = [new_output("stream", name="stdout", text="hidden test printed\n")]
    widget = {
        "application/vnd.jupyter.widget-view+json": {"model_id": "m", "version_major": 2},
        "image/png": "iVBORw0KGgo=",
        "text/plain": "interactive(children=(IntSlider(value=0),))",
    }
    ran.cells[4].outputs = [
        new_output("stream", name="stdout", text="3\n"),
        new_output("display_data", data=widget),
        new_output("display_data", data={k: widget[k] for k in widget if k != "image/png"}),
    ]
    ran.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    released = nbformat.reads(nbformat.writes(ran), as_version=4)
    released.metadata.pop("widgets")
    released.cells[
        2
    ].source = "def add(a, b):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    released.cells[3].source = "assert add(1, 2) == 3"
    for cell in released.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return released, ran


# ------------------------------------------------------------- outputs onto the release ---
def test_demo_cells_get_the_run_outputs_and_exercises_stay_as_released():
    released, ran = _pair()
    page = pages.learner_page(released, ran, "99-tiny")
    by_id = {c.get("id"): c for c in page.cells}
    assert by_id["demo"].outputs == ran.cells[1].outputs
    assert by_id["demo"].execution_count == 1
    assert by_id["stub"].source == released.cells[2].source and by_id["stub"].outputs == []
    assert by_id["test"].source == "assert add(1, 2) == 3" and by_id["test"].outputs == []
    text = nbformat.writes(page)
    assert "HIDDEN TESTS" not in text and "solution printed" not in text
    assert released.cells[1].outputs == [], "the released notebook itself is not changed"


def test_live_widgets_leave_their_picture_and_the_note_precedes_outputs_of_exercises():
    released, ran = _pair()
    page = pages.learner_page(released, ran)
    cell = next(c for c in page.cells if c.get("id") == "uses-exercise")
    assert [o.output_type for o in cell.outputs] == ["stream", "display_data"]
    assert set(cell.outputs[1].data) == {"image/png", "text/plain"}, "the widget's picture stays"
    assert "widgets" not in page.metadata
    before = page.cells[page.cells.index(cell) - 1]
    assert before.cell_type == "markdown" and before.source == pages.NEEDS_EXERCISES
    assert pages.needs_exercises(released.cells) == {"uses-exercise"}


def test_links_between_sections_point_at_the_page_anchors():
    cells = [
        new_markdown_cell("## Beyond ZB-H1\n\nSee [the list](#Beyond-ZB-H1) and [x](#Nowhere)."),
        new_markdown_cell("## `no_sync`, measured"),
        new_markdown_cell("back to [it](#no_sync,-measured)"),
    ]
    pages.link_headings(cells)
    assert "[the list](#beyond-zb-h1)" in cells[0].source
    assert "[x](#Nowhere)" in cells[0].source, (
        "a link to no heading is left for the build to report"
    )
    assert cells[2].source == "back to [it](#no-sync-measured)"


@pytest.mark.parametrize("change", ["missing", "edited"])
def test_a_run_of_another_version_is_refused_by_cell(change):
    released, ran = _pair()
    if change == "missing":
        del ran.cells[1]
    else:
        ran.cells[1].source = "print(5)"
    with pytest.raises(ValueError, match=r"99-tiny: demo cell 'demo' .*--fresh"):
        pages.learner_page(released, ran, "99-tiny")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_course_notebook_maps_onto_its_release(assignment):
    """nbgrader kept every cell id and demo source: the solution notebook (standing in for its
    run) maps onto the released one, and the page shows no solution and no hidden test."""
    source = nbformat.read(grading.source_notebooks(ROOT, assignment)[0], as_version=4)
    released_path = ROOT / "course" / assignment / f"{assignment}.ipynb"
    page = pages.learner_page(nbformat.read(released_path, as_version=4), source, assignment)
    text = "\n".join(c.source for c in page.cells)
    assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text
    released_ids = [c.get("id") for c in nbformat.read(released_path, as_version=4).cells]
    assert [c.get("id") for c in page.cells if not c.get("id", "").endswith("-note")] == (
        released_ids
    )


# ------------------------------------------------------------------ executed copies ---
def _tiny_course(tmp_path: Path) -> Path:
    root = tmp_path / "course-root"
    (root / "solutions" / "99-tiny").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text("c = get_config()\n")
    _, ran = _pair()
    nbformat.write(ran, root / "solutions" / "99-tiny" / "99-tiny.ipynb")
    return root


def test_an_executed_copy_is_used_only_for_the_notebook_it_ran(tmp_path):
    root = _tiny_course(tmp_path)
    autograded = tmp_path / "autograded" / "solution" / "99-tiny"
    autograded.mkdir(parents=True)
    shutil.copy(root / "solutions" / "99-tiny" / "99-tiny.ipynb", autograded / "99-tiny.ipynb")
    keep = tmp_path / "keep"
    assert executed.store(autograded.parent, keep, root) == ["99-tiny"]
    assert executed.find(root, "99-tiny", [tmp_path / "nowhere", keep]) == keep / "99-tiny.ipynb"
    source = root / "solutions" / "99-tiny" / "99-tiny.ipynb"
    source.write_text(source.read_text().replace("print(2 + 2)", "print(2 + 3)"))
    assert executed.find(root, "99-tiny", [keep]) is None, "a run of the old notebook"


def test_a_run_in_which_a_cell_raised_is_not_kept(tmp_path):
    """A solution notebook runs clean; a run that did not (a timing fit on an overloaded
    machine once raised) would put a traceback on the page, so it is not kept."""
    root = _tiny_course(tmp_path)
    autograded = tmp_path / "autograded" / "solution" / "99-tiny"
    autograded.mkdir(parents=True)
    _, ran = _pair()
    ran.cells[1].outputs.append(new_output("error", ename="ValueError", evalue="x", traceback=[]))
    nbformat.write(ran, autograded / "99-tiny.ipynb")
    assert executed.raised(ran) == ["demo"]
    assert executed.store(autograded.parent, tmp_path / "keep", root) == []
    assert executed.find(root, "99-tiny", [tmp_path / "keep"]) is None


def test_build_without_runs_and_without_execute_says_what_is_missing(tmp_path, capsys):
    root = _tiny_course(tmp_path)
    out = tmp_path / "site"
    code = cli.main(["site", "build", "--course-root", str(root), "--out", str(out),
                     "--executed", str(tmp_path / "empty"), "--no-execute"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "no executed copy of 99-tiny" in err and "python -m pytest tests/test_course.py" in err
    assert not (root / "build").exists(), "nothing written for a refused build"


def test_the_course_tests_keep_their_runs_where_the_build_reads_them():
    folders = executed.default_folders(ROOT)
    assert folders[1] == ROOT / ".pytest_cache" / "d" / executed.PYTEST_CACHE_KEY
    course_tests = (Path(__file__).parent / "test_course.py").read_text()
    assert "executed.store(" in course_tests and "executed.PYTEST_CACHE_KEY" in course_tests


# ------------------------------------------------------------------------- staging ---
@pytest.mark.slow  # 6.7 s measured (the deck, the library pages, 14 notebooks, twice)
def test_staging_writes_every_page_once_and_drops_what_is_gone(tmp_path):
    from distlab.site import build

    src = tmp_path / "src"
    (src / "notebooks").mkdir(parents=True)
    (src / "notebooks" / "99-removed.ipynb").write_text("{}")
    ran = {a: grading.source_notebooks(ROOT, a)[0] for a in ASSIGNMENTS}  # stand-ins for runs
    build.stage(ROOT, ran, src)
    assert not (src / "notebooks" / "99-removed.ipynb").exists(), "a stale page stays"
    for page in ("index.md", "getting-started.md", "flashcards/index.md", "library/calc.md"):
        assert (src / page).is_file(), page
    for assignment in ASSIGNMENTS:
        nb = nbformat.read(src / "notebooks" / f"{assignment}.ipynb", as_version=4)
        assert nb.cells[1].get("id") == "distlab-site-work-on-it"
        assert (src / "notebooks" / "released" / f"{assignment}.ipynb").read_bytes() == (
            (ROOT / "course" / assignment / f"{assignment}.ipynb").read_bytes()
        )
    before = {p: p.stat().st_mtime_ns for p in src.rglob("*") if p.is_file()}
    build.stage(ROOT, ran, src)
    after = {p: p.stat().st_mtime_ns for p in src.rglob("*") if p.is_file()}
    assert after == before, "an unchanged page was written again (Sphinx would re-read it)"


# --------------------------------------------------------------------- the page's box ---
@pytest.mark.parametrize("assignment", ["00-launching", "13-sharded-matmuls-and-overlap"])
def test_each_page_names_commands_that_parse_and_the_binder_link_of_the_readme(assignment):
    box = pages.work_on_it(assignment, f"released/{assignment}.ipynb")
    grade = pages.grade_command(assignment)
    drill = pages.drill_command(assignment)
    assert f"```bash\n{grade}\n{drill}\n```" in box
    args = cli.build_parser().parse_args(shlex.split(grade)[1:])
    assert args.notebook == assignment[:2]
    assert flashcards_parser().parse_args(shlex.split(drill)[1:]).notebook == assignment
    assert f"{{download}}`download {assignment}.ipynb <released/{assignment}.ipynb>`" in box
    url = pages.binder_url(f"course/{assignment}/{assignment}.ipynb")
    assert f"[Launch it on Binder]({url})" in box
    if assignment == "00-launching":
        assert f"]({url})" in (ROOT / "README.md").read_text(), "the README's Binder badge"


# --------------------------------------------------------------------------- the deck ---
def test_deck_pages_list_every_note_once_linked_to_its_section(tmp_path):
    the_deck = load_deck(TEST_DECK)
    notebooks = {a: ROOT / "solutions" / a / f"{a}.ipynb" for a in ASSIGNMENTS}
    titles = {a: a.upper() for a in ASSIGNMENTS}
    written = deck.write_deck_pages(the_deck, tmp_path, notebooks, titles)
    names = sorted(p.name for p in written)
    assert names == ["02-collectives.md", "03-algorithms-and-cost.md", "06-zero-and-fsdp.md",
                     "index.md"]  # fmt: skip
    page = (tmp_path / "02-collectives.md").read_text()
    assert "](../notebooks/02-collectives.ipynb#all-gather)" in page
    for card in the_deck.cards:
        text = (tmp_path / f"{card.notebook_folder}.md").read_text()
        assert text.count(f"`{card.note}` (") == 1, card.note
    index = (tmp_path / "index.md").read_text()
    assert "| [02-COLLECTIVES](02-collectives.md) |" in index


def test_a_cloze_note_shows_once_with_its_deletions_in_bold():
    cards = [c for c in load_deck().cards if c.kind == "cloze"]
    if not cards:
        pytest.skip("the course deck has no cloze note")
    text = deck.card_markdown(cards[0])
    assert "{{c" not in text and "**" in text


def test_the_course_deck_sections_are_headings_of_the_notebooks():
    """Every card's section is a heading anchor of its notebook, so its link lands."""
    the_deck = load_deck()
    for card in the_deck.cards:
        folder, _, section = card.notebook.partition("#")
        if section:
            solutions = ROOT / "solutions" / folder / f"{folder}.ipynb"
            assert section in notebook_sections(solutions), card.slug


# ------------------------------------------------------------------------ the library ---
def test_every_module_is_on_exactly_one_library_page():
    import distlab
    import flashcards

    listed = [m for area in api.AREAS for p in area.packages for m in api.modules_of(p)]
    assert len(listed) == len(set(listed)), "a module on two pages"
    ours = {
        name
        for pkg in (distlab, flashcards)
        for name in api.modules_of(pkg.__name__)
        if name not in ("distlab",)
    }
    assert ours - set(listed) == set(), "modules on no page"
    page = api.area_page(next(a for a in api.AREAS if a.slug == "calc"))
    assert "```{automodule} distlab.calc.pipeline\n:members:\n```" in page


# --------------------------------------------------------------------------- anchors ---
def test_heading_anchors_are_the_flashcard_anchors():
    import importlib

    from distlab.site import conf

    module, _, name = conf.myst_heading_slug_func.rpartition(".")
    assert getattr(importlib.import_module(module), name) is section_anchor
    assert conf.myst_heading_anchors >= 6
    assert section_anchor("Exercise 4: accumulate with `no_sync`") == (
        "exercise-4-accumulate-with-no-sync"
    )


@pytest.mark.slow
def test_a_small_sphinx_build_puts_those_anchors_and_local_math_in_the_html(tmp_path):
    """Sphinx itself, on a notebook with the awkward headings (a leading digit, code in the
    title): the ids are the flashcards' anchors, and MathJax is the local copy."""
    src = tmp_path / "src"
    src.mkdir()
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Tiny\n\nMath $p - 1$.\n\n## 1F1B\n\n## Accumulate with `no_sync`")
        ]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, src / "tiny.ipynb")
    (src / "index.md").write_text("# Index\n\n```{toctree}\ntiny\n```\n")
    code = (
        "import sys; from pathlib import Path; from distlab.site import build;"
        f"build.run_sphinx(Path({str(src)!r}), Path({str(tmp_path / 'out')!r}), '1')"
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    html = (tmp_path / "out" / "html" / "tiny.html").read_text()
    assert 'id="1f1b"' in html and 'id="accumulate-with-no-sync"' in html
    assert "_static/mathjax/tex-mml-chtml.js" in html and "cdn." not in html
    assert (tmp_path / "out" / "html" / "_static" / "mathjax" / "tex-mml-chtml.js").is_file()
