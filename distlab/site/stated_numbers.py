"""What vouches for each number a notebook's prose states: a tie, a code cell, or a source.

DESIGN.md asks that every number in a notebook's prose come from distlab. For each number
stated in the markdown cells of a solution notebook (what counts as one:
:mod:`distlab.site.prose_numbers`) this module says what checks it, the first that applies:

* **tied**: the markdown cell's metadata ties it to a library expression, in the deck's check
  format (:class:`flashcards.model.Check`, read by :func:`flashcards.model.parse_checks`)::

      "metadata": {"distlab": {"numbers": [
          {"text": "1,440 MiB", "expr": "calc.comm....", "value": 1440, "rel_tol": 0.001}]}}

  ``text`` is a substring of the cell holding exactly one stated number, ``value`` that number
  as written (in the units written), and the expression is evaluated by the deck's own
  evaluator (:func:`flashcards.checks.evaluate`: ``calc``, ``sim`` and ``math`` in scope). A
  number of the same sentence written in the expression (``7e9`` for "7B", ``0.02`` for "2%")
  is tied too, as an input of the tied result;
* **printed**: a code cell prints it (outputs of the executed copy the test run keeps,
  :mod:`distlab.site.executed`) or writes it as an input in its source (``model_preset("70B")``,
  ``seq_len=4096``). The code cell must be in the number's own section (between the headings
  around it), or anywhere in the notebook for a number of three significant digits or more
  (:attr:`~distlab.site.prose_numbers.Stated.distinctive`: nothing prints ``57344`` by chance)
  and for a number in a section without code (a summary restates what the notebook printed).
  It must read as the printed number
  (:meth:`~distlab.site.prose_numbers.Stated.reads_as`: thousands separators dropped, rounded
  to the digits stated) and, for a quantity with a unit, up to a unit prefix (a power of
  1,000: "79 µs" reads ``7.9e-05``; "40 %" reads ``0.4``);
* **cited**: its sentence names a place in a source (Section, §, Table, Figure, Eq.,
  Appendix: :data:`distlab.site.citations.PLACE`);
* **unchecked**: none of these.

``python -m distlab.site.stated_numbers`` prints the table (stated, tied, printed, cited,
unchecked per notebook, then each unchecked number with its sentence);
``tests/test_stated_numbers.py`` fails on each unchecked number and each tie whose expression
does not give its value. The module lives with the site because it reads what the site reads
(the executed notebooks) and may import ``flashcards`` (``tests/test_layers.py``).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass

from distlab.core.course import assignment_names, find_course_root, source_notebook
from distlab.site import executed
from distlab.site.citations import place_in
from distlab.site.prose_numbers import Stated, stated_numbers
from flashcards.checks import agrees, evaluate
from flashcards.model import Check, parse_checks

#: the verdicts, in the order they are tried
VERDICTS = ("tied", "printed", "cited", "unchecked")
_IN_CODE = re.compile(r"\d[\d_]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
_PRINTED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)


@dataclass(frozen=True)
class Verdict:
    """What checks one stated number: ``how`` is one of :data:`VERDICTS`."""

    number: Stated
    how: str
    detail: str = ""


# ---------------------------------------------------------------------------- ties ---
def ties(cell) -> tuple[Check, ...]:
    """The number ties of a markdown cell (``metadata.distlab.numbers``), read by the deck's
    own parser: each ``text`` must be in the cell."""
    raw = cell.get("metadata", {}).get("distlab", {}).get("numbers", [])

    def fail(field: str, message: str) -> ValueError:
        return ValueError(
            f"cell {cell.get('id', '?')}: metadata distlab.numbers: {field} {message}"
        )

    return parse_checks(raw, fail=fail, q=cell.source, a=cell.source)


def numbers_in(text: str, source: str, numbers: list[Stated]) -> list[Stated]:
    """The stated ``numbers`` of the cell ``source`` inside an occurrence of ``text`` in it."""
    spans, at = [], source.find(text)
    while at >= 0:
        spans.append((at, at + len(text)))
        at = source.find(text, at + 1)
    return [n for n in numbers if any(a <= n.start and n.end <= b for a, b in spans)]


def tie_problems(
    tie: Check, source: str, numbers: list[Stated], names: dict | None = None
) -> list[str]:
    """What is wrong with one tie of the cell ``source`` (whose stated numbers are
    ``numbers``): its text must hold exactly one of them, ``value`` must read as it, and the
    expression must give ``value`` within ``rel_tol``. Empty when the tie holds."""
    inside = numbers_in(tie.text, source, numbers)
    if len(inside) != 1:
        held = ", ".join(repr(n.text) for n in inside) or "none"
        return [f"tie {tie.text!r} must hold exactly one stated number; it holds {held}"]
    problems = []
    if not inside[0].reads_as(tie.value):
        problems.append(
            f"tie {tie.text!r}: value {tie.value:g} does not read as {inside[0].text!r}"
        )
    try:
        actual = evaluate(tie, names)
    except Exception as exc:  # noqa: BLE001 - reported per tie
        return [*problems, f"tie {tie.text!r}: {tie.expr} raised {type(exc).__name__}: {exc}"]
    if not agrees(actual, tie):
        problems.append(
            f"tie {tie.text!r}: {tie.expr} = {actual!r}, not {tie.value:g} "
            f"(rel_tol {tie.rel_tol:g})"
        )
    return problems


# ------------------------------------------------------------------ printed, in code ---
def code_numbers(nb, *, outputs: bool) -> list[set[float]]:
    """One set per code cell of ``nb``, in order: the numbers its outputs print (stream and
    ``text/plain``; ``outputs=True``) or its source writes (``outputs=False``)."""
    found = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        if outputs:
            texts = [
                o.get("text", "") or o.get("data", {}).get("text/plain", "")
                for o in cell.get("outputs", [])
            ]
            pattern = _PRINTED
        else:
            texts, pattern = [cell.source], _IN_CODE
        found.append(
            {
                float(m.group(0).replace(",", "").replace("_", ""))
                for t in texts
                for m in pattern.finditer(t)
            }
        )
    return found


def sections(nb) -> tuple[list[int], dict[str, list[int]]]:
    """Which section each code cell of ``nb`` is in (the number of headings above it), and,
    for each markdown cell by id, the offsets in its source where its headings start."""
    of_code, headings, seen = [], {}, 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            of_code.append(seen)
        elif cell.cell_type == "markdown":
            starts = [m.start() for m in _HEADING.finditer(cell.source)]
            headings[cell.get("id", "?")] = starts
            seen += len(starts)
    return of_code, headings


def _found_in(number: Stated, numbers: list[set[float]], cells: list[int]) -> int | None:
    for index in cells:
        if index < len(numbers) and any(number.reads_as_scaled(v) for v in numbers[index]):
            return index
    return None


# ------------------------------------------------------------------------- verdicts ---
@dataclass
class NotebookReport:
    """The verdicts on one notebook's stated numbers, and the problems of its ties."""

    notebook: str
    verdicts: list[Verdict]
    tie_problems: list[str]
    executed: bool  # whether an executed copy was read (else outputs count for nothing)

    def count(self, how: str) -> int:
        return sum(v.how == how for v in self.verdicts)


def check_notebook(nb, notebook: str, ran=None, names: dict | None = None) -> NotebookReport:
    """Every stated number of the source notebook ``nb`` with its verdict; ``ran`` is its
    executed copy (None: only the code cells' sources count as printing a number)."""
    printed = code_numbers(ran, outputs=True) if ran is not None else []
    written = code_numbers(nb, outputs=False)
    code_section, headings = sections(nb)
    verdicts, problems, above = [], [], 0
    for cell in (c for c in nb.cells if c.cell_type == "markdown"):
        cell_id = cell.get("id", "?")
        numbers = stated_numbers(cell.source, notebook=notebook, cell=cell_id)
        tied, cell_problems = _tied(cell, numbers, names)
        problems += [f"{notebook} cell {cell_id}: {p}" for p in cell_problems]
        for n in numbers:
            section = above + sum(start < n.start for start in headings[cell_id])
            cells = [i for i, s in enumerate(code_section) if s == section or n.distinctive]
            if not any(s == section for s in code_section):  # a summary: the whole notebook
                cells = list(range(len(code_section)))
            verdicts.append(_verdict(n, tied.get(n), printed, written, cells))
        above += len(headings[cell_id])
    return NotebookReport(notebook, verdicts, problems, ran is not None)


def _tied(cell, numbers: list[Stated], names) -> tuple[dict[Stated, str], list[str]]:
    """The numbers of one markdown cell its ties check, each with the expression (a number
    written as an input of a tie's expression in the same sentence counts too), and the
    problems of its ties."""
    try:
        cell_ties = ties(cell)
    except ValueError as exc:
        return {}, [str(exc)]
    tied, problems = {}, []
    for tie in cell_ties:
        problems += tie_problems(tie, cell.source, numbers, names)
        inside = numbers_in(tie.text, cell.source, numbers)
        tied.update((n, tie.expr) for n in inside)
        literals = _literals(tie.expr)
        sentences = {n.sentence for n in inside}
        for n in numbers:
            if n.sentence in sentences and any(n.reads_as_scaled(v) for v in literals):
                tied.setdefault(n, f"input of {tie.expr}")
    return tied, problems


def _literals(expr: str) -> list[float]:
    """The numbers written in a Python expression (``7e9``, ``0.02``, ``256``)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return []
    return [
        float(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float)
    ]


def _verdict(number: Stated, tie: str | None, printed, written, cells: list[int]) -> Verdict:
    if tie is not None:
        return Verdict(number, "tied", tie)
    index = _found_in(number, printed, cells)
    if index is not None:
        return Verdict(number, "printed", f"output of code cell {index}")
    index = _found_in(number, written, cells)
    if index is not None:
        return Verdict(number, "printed", f"source of code cell {index}")
    place = place_in(number.sentence)
    if place is not None:
        return Verdict(number, "cited", place)
    return Verdict(number, "unchecked")


def check_course(
    root: str | os.PathLike, folders: list[str | os.PathLike] | None = None
) -> list[NotebookReport]:
    """:func:`check_notebook` for every solution notebook of the course ``root``, with its
    executed copy from ``folders`` (default: the site build's and the test run's) where one
    ran today's notebook."""
    import nbformat

    folders = folders if folders is not None else executed.default_folders(root)
    reports = []
    for assignment in assignment_names(root):
        nb = nbformat.read(source_notebook(root, assignment), as_version=4)
        ran_path = executed.find(root, assignment, folders)
        ran = nbformat.read(ran_path, as_version=4) if ran_path else None
        reports.append(check_notebook(nb, assignment, ran))
    return reports


# ---------------------------------------------------------------------------- table ---
def table(reports: list[NotebookReport], *, every: bool = False) -> str:
    """The counts per notebook, then each unchecked number (``every``: each number) with its
    sentence, then each tie's problem."""
    lines = [f"{'notebook':<38}{'stated':>7}" + "".join(f"{h:>10}" for h in VERDICTS)]
    total = Counter()
    for r in reports:
        counts = {h: r.count(h) for h in VERDICTS} | {"stated": len(r.verdicts)}
        total.update(counts)
        note = "" if r.executed else "  (no executed copy: outputs not read)"
        lines.append(
            f"{r.notebook:<38}{counts['stated']:>7}"
            + "".join(f"{counts[h]:>10}" for h in VERDICTS)
            + note
        )
    lines.append(
        f"{'total':<38}{total['stated']:>7}" + "".join(f"{total[h]:>10}" for h in VERDICTS)
    )
    for r in reports:
        for v in r.verdicts:
            if every or v.how == "unchecked":
                detail = f" [{v.detail}]" if v.detail else ""
                lines.append(
                    f"{v.how:>9}  {r.notebook} cell {v.number.cell}: {v.number.text!r}{detail} "
                    f"in: {v.number.sentence}"
                )
        lines += r.tie_problems
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m distlab.site.stated_numbers``: print the table; exit status 1 if a number is
    unchecked or a tie fails, 2 if a notebook has no executed copy (its outputs unread)."""
    parser = argparse.ArgumentParser(
        prog="python -m distlab.site.stated_numbers",
        description="The numbers each solution notebook's prose states, and what checks each: "
        "tied to a library expression, printed by a code cell of its section, cited with its "
        "section or table, or unchecked.",
    )
    parser.add_argument("--course-root", metavar="DIR", help="the course checkout to check")
    parser.add_argument(
        "--executed",
        metavar="DIR",
        action="append",
        help="a folder of executed notebooks (default: the site build's and the test run's, "
        ".pytest_cache/d/executed-notebooks); repeat for several",
    )
    parser.add_argument(
        "--run",
        action="store_true",
        help="first run (with nbgrader, about a minute each) the notebooks that no folder "
        "holds a run of, into the site build's folder",
    )
    parser.add_argument("--all", action="store_true", help="list every stated number")
    args = parser.parse_args(argv)
    root = find_course_root(args.course_root)
    folders = args.executed or executed.default_folders(root)
    if args.run:
        missing = [a for a in assignment_names(root) if not executed.find(root, a, folders)]
        if missing:
            executed.execute(root, missing, root / executed.OWN_FOLDER)
            folders = [root / executed.OWN_FOLDER, *folders]
    reports = check_course(root, folders)
    print(table(reports, every=args.all))
    if any(r.count("unchecked") or r.tie_problems for r in reports):
        return 1
    return 0 if all(r.executed for r in reports) else 2


__all__ = [
    "VERDICTS",
    "NotebookReport",
    "Verdict",
    "check_course",
    "check_notebook",
    "code_numbers",
    "main",
    "numbers_in",
    "sections",
    "table",
    "tie_problems",
    "ties",
]

if __name__ == "__main__":
    sys.exit(main())
