"""One site page per notebook: the released notebook, with the outputs of a real run.

:func:`learner_page` takes the notebook as ``course/`` releases it (exercise stubs, visible
tests only) and gives each demo cell the outputs that cell printed and drew when the solution
notebook ran (:mod:`distlab.site.executed`). nbgrader keeps every cell's id when it releases a
notebook, so a demo cell is found by id, and its source must be the same in both (else the
run is of another version of the notebook, and the page would show outputs of other code).
Exercise cells (the stubs) and test cells keep no output: the learner sees them as released.
A link from one part of the notebook to another (JupyterLab's ``#Heading-Text``) is pointed
at the page's anchor of that heading (:func:`link_headings`).

:func:`work_on_it` is the box each page opens with: launch it on Binder, download it, grade
it and drill its flashcards.
"""

from __future__ import annotations

import copy
import re
from urllib.parse import quote

from distlab.grading.slicing import cell_names
from flashcards.course_order import markdown_headings, section_anchor

#: the GitHub repository Binder builds (the README's badge uses the same one)
REPOSITORY = "distlab/distlab"
BINDER = "https://mybinder.org/v2/gh/{repository}/HEAD?urlpath=lab/tree/{path}"

#: output data a static page cannot show: a live widget needs its kernel
LIVE_ONLY = ("application/vnd.jupyter.widget-view+json",)
#: a widget's text form (``interactive(children=...)``) says nothing to a reader
WIDGET_REPR = ("interactive(", "VBox(", "HBox(", "Output(", "IntSlider(", "Play(")


def is_exercise_cell(cell) -> bool:
    """An exercise's stub or its test cell (nbgrader ``solution`` or ``grade``)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade"))


#: the note before a demo cell whose output needs the exercises above it
NEEDS_EXERCISES = (
    "*The output below is what this cell shows once the exercises above are written (it ran "
    "with the solutions); until then it says what is missing.*"
)


def needs_exercises(cells) -> set[str]:
    """Ids of the demo cells that use a name an exercise's stub defines (they print other
    output until the learner writes it)."""
    defined, needing = set(), set()
    for cell in cells:
        if cell.cell_type != "code":
            continue
        names = cell_names(cell.source)
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            defined |= names.defines
        elif not is_exercise_cell(cell) and names.uses & defined:
            needing.add(cell.get("id"))
    return needing


def learner_page(released, executed, name: str = "notebook"):
    """A copy of ``released`` whose demo cells hold ``executed``'s outputs (see module), with
    :data:`NEEDS_EXERCISES` before each demo cell whose output needs the exercises.

    ValueError names the first demo cell that ``executed`` lacks or ran with other code."""
    import nbformat

    page = copy.deepcopy(released)
    ran = {cell.get("id"): cell for cell in executed.cells}
    needing = needs_exercises(page.cells)
    for cell in page.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if is_exercise_cell(cell):
            continue
        twin = ran.get(cell.get("id"))
        if twin is None or twin.source != cell.source:
            why = "is missing" if twin is None else "ran other code"
            raise ValueError(
                f"{name}: demo cell {cell.get('id')!r} {why} in the executed notebook: "
                "it ran another version of the solutions (run `distlab site build --fresh`)"
            )
        cell.outputs = [o for o in (_static(o) for o in twin.get("outputs", [])) if o]
        cell.execution_count = twin.get("execution_count")
    page.metadata.pop("widgets", None)  # live widget state: its views are left out above
    link_headings(page.cells)
    for index in reversed(range(len(page.cells))):
        cell = page.cells[index]
        if cell.get("id") in needing and cell.outputs:
            note = nbformat.v4.new_markdown_cell(NEEDS_EXERCISES, id=f"{cell.id}-note")
            page.cells.insert(index, note)
    return page


def _static(output):
    """``output`` as a static page can show it, or None when nothing of it is left."""
    if output.get("output_type") not in ("display_data", "execute_result"):
        return output
    data = {k: v for k, v in output.get("data", {}).items() if k not in LIVE_ONLY}
    dropped = len(data) < len(output.get("data", {}))
    if dropped and set(data) == {"text/plain"} and data["text/plain"].startswith(WIDGET_REPR):
        return None
    if not data:
        return None
    kept = copy.deepcopy(output)
    kept["data"] = data
    return kept


#: a Markdown link to a heading of the same notebook: ``[text](#Beyond-ZB-H1)``
#:
#: :meta hide-value:
LOCAL_LINK = re.compile(r"\]\(#([^)\s]+)\)")


def link_headings(cells) -> None:
    """Point each in-notebook link at its heading's anchor on the page.

    JupyterLab names a heading's anchor after its text (``#Beyond-ZB-H1``); the page uses the
    flashcards' anchors (``#beyond-zb-h1``). A link that names no heading is left as it is
    (and the build reports it)."""
    anchors = {
        section_anchor(heading)
        for cell in cells
        if cell.cell_type == "markdown"
        for heading in markdown_headings(cell.source)
    }

    def relink(match: re.Match) -> str:
        anchor = section_anchor(match.group(1))
        return f"](#{anchor})" if anchor in anchors else match.group(0)

    for cell in cells:
        if cell.cell_type == "markdown":
            cell.source = LOCAL_LINK.sub(relink, cell.source)


def binder_url(notebook_path: str, repository: str = REPOSITORY) -> str:
    """Binder's link that opens ``notebook_path`` (relative to the repository) in JupyterLab."""
    return BINDER.format(repository=repository, path=quote(notebook_path))


def grade_command(assignment: str) -> str:
    """``distlab grade 02``: the notebook's number is enough."""
    return f"distlab grade {assignment.split('-', 1)[0]}"


def drill_command(assignment: str) -> str:
    """``flashcards drill --notebook 02-collectives``: that notebook's cards."""
    return f"flashcards drill --notebook {assignment}"


def work_on_it(assignment: str, download: str) -> str:
    """The MyST Markdown of the box at the top of each notebook page.

    ``download``: the released notebook's path relative to the page, for the
    ``{download}`` role."""
    path = f"course/{assignment}/{assignment}.ipynb"
    return "\n".join(
        [
            ":::{admonition} Work through this notebook",
            ":class: tip distlab-work",
            "",
            (
                f"[Launch it on Binder]({binder_url(path)}) (nothing to install) or "
                f"{{download}}`download {assignment}.ipynb <{download}>` "
                f"(it is `{path}` in the repository). This page shows it as you get it, "
                "with the outputs of a real run of its demo cells; the exercises are yours."
            ),
            "",
            "Grade your copy, then drill the flashcards of this notebook:",
            "",
            "```bash",
            grade_command(assignment),
            drill_command(assignment),
            "```",
            ":::",
        ]
    )
