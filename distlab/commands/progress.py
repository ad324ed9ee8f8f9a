"""``distlab progress`` (and ``distlab.progress_table()`` in a notebook): per notebook, the
exercises passed in the last official grade and in the last check, when, and the flashcards
due.

It only reads what the learner's tools already record in their own data folder: the grades
(``distlab grade``) and checks (``distlab.check``) in :mod:`distlab.grading.record`, and the
flashcards' review store (:mod:`flashcards.store`, ``$DISTLAB_FLASHCARDS_DB``), whose due
cards are counted by the drill's own queue (:func:`flashcards.scheduler.build_queue`: learning
cards due now or within the learn-ahead limit, reviews due today). A review store that does
not exist yet is not created: every card is then new.

* ``graded``: exercises whose newest official result (the whole notebook, or ``--exercise``)
  has full points, of the notebook's exercises, and when the newest of those results was;
* ``checked``: the same for ``distlab.check`` in the notebook's kernel (not a grade);
* ``cards``: the notebook's flashcards due today, and those never reviewed.
"""

from __future__ import annotations

import html
import io
import json
import os
import textwrap
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from distlab.core.course import assignment_names, find_course_root, source_notebooks
from distlab.grading.cells import is_graded
from distlab.grading.record import CHECKED, GRADED, read_records, records_dir
from flashcards.model import load_deck
from flashcards.scheduler import build_queue, day_window
from flashcards.store import Store, default_db_path

START_HERE = (
    "Nothing recorded yet in {where}. Start with notebook 00: check an exercise in its "
    "kernel with `distlab.check(1)`, grade the notebook with `distlab grade 00` in a "
    "terminal, and drill its flashcards with `flashcards drill --up-to 00`; then run "
    "`distlab progress` again."
)


@dataclass(frozen=True)
class Result:
    """One kind of result (grade or check) of one notebook."""

    passed: int  # exercises at full points in their newest result of this kind
    recorded: int  # exercises with a result of this kind
    exercises: int  # exercises in the notebook (the recorded ones if the course is not here)
    at: str | None  # when the newest of those results was (ISO, local time)

    def cell(self) -> str:
        if not self.recorded:
            return "-"
        when = self.at.replace("T", " ")[:16] if self.at else "?"
        some = f" ({self.recorded} run)" if self.recorded < self.exercises else ""
        return f"{self.passed}/{self.exercises} passed{some}, {when}"


@dataclass(frozen=True)
class NotebookProgress:
    notebook: str
    graded: Result
    checked: Result
    cards_due: int
    cards_new: int

    def cards(self) -> str:
        if not self.cards_due and not self.cards_new:
            return "-"
        return f"{self.cards_due} due, {self.cards_new} new"


COLUMNS = ("notebook", "graded (distlab grade)", "checked (distlab.check)", "flashcards")


@dataclass(frozen=True)
class ProgressTable:
    """The table: text in a terminal (``str``), HTML in Jupyter."""

    rows: tuple[NotebookProgress, ...]
    where: str  # the records' folder
    reviewed: bool  # the review store holds a review

    @property
    def empty(self) -> bool:
        return not self.reviewed and not any(
            r.graded.recorded or r.checked.recorded for r in self.rows
        )

    def cells(self) -> list[tuple[str, str, str, str]]:
        return [(r.notebook, r.graded.cell(), r.checked.cell(), r.cards()) for r in self.rows]

    def __str__(self) -> str:
        if self.empty:
            return START_HERE.format(where=self.where)
        from rich.console import Console
        from rich.table import Table

        table = Table(*COLUMNS, title="distlab progress", title_justify="left")
        for row in self.cells():
            table.add_row(*row)
        out = io.StringIO()
        Console(file=out, width=120, no_color=True, force_terminal=False).print(table)
        lines = [line.rstrip() for line in out.getvalue().rstrip().splitlines()]
        return "\n".join([*lines, *textwrap.wrap(NOTE, 100)])

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        if self.empty:
            return f"<p>{html.escape(START_HERE.format(where=self.where))}</p>"
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>" for v in row)
            + "</tr>"
            for row in self.cells()
        )  # fmt: skip
        return (
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p><small>{html.escape(NOTE)}</small></p>"
        )

    def as_json(self) -> dict:
        return {"records": self.where, "notebooks": [asdict(r) for r in self.rows]}


NOTE = (
    "graded: the newest `distlab grade` of each exercise (a fresh kernel); checked: the newest "
    "`distlab.check` (your notebook's kernel, not a grade); flashcards: due today, never seen."
)


def progress_table(
    data: str | os.PathLike | None = None,
    db: str | os.PathLike | None = None,
    now: datetime | None = None,
    root: str | os.PathLike | None = None,
) -> ProgressTable:
    """The progress table from the learner's data folder (``data``, default
    ``$DISTLAB_DATA_DIR`` or the user data folder), their review store (``db``, default
    ``$DISTLAB_FLASHCARDS_DB`` or the user data folder) at ``now`` (default: now)."""
    records = read_records(data)
    counts = _exercise_counts(root)
    due, new, reviewed = _cards(db, now or datetime.now(UTC))
    names = sorted(set(counts) | set(records) | set(due))
    rows = tuple(
        NotebookProgress(
            name,
            _result(records.get(name, {}).get(GRADED, {}), counts.get(name)),
            _result(records.get(name, {}).get(CHECKED, {}), counts.get(name)),
            due.get(name, 0),
            new.get(name, 0),
        )
        for name in names
    )
    return ProgressTable(rows, str(records_dir(data)), reviewed)


def _result(entries: dict, exercises: int | None) -> Result:
    passed = sum(e.get("points", 0) >= e.get("max_points", 0) for e in entries.values())
    times = [e["at"] for e in entries.values() if e.get("at")]
    return Result(passed, len(entries), exercises or len(entries), max(times, default=None))


def _exercise_counts(root) -> dict[str, int]:
    """assignment -> its number of graded test cells (empty when the course is not found)."""
    try:
        course = find_course_root(root)
    except FileNotFoundError:
        return {}
    counts = {}
    for assignment in assignment_names(course):
        cells = []
        for path in source_notebooks(course, assignment):
            cells += json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
        counts[assignment] = sum(is_graded(c) for c in cells)
    return counts


def _cards(db, now: datetime) -> tuple[dict[str, int], dict[str, int], bool]:
    """(notebook -> cards due today, notebook -> cards never reviewed, any review at all)."""
    path = Path(db).expanduser() if db is not None else default_db_path()
    states = {}
    if path.is_file():
        with Store(path) as store:
            states = store.card_states()
    _, day_end = day_window(now)
    by_notebook: dict[str, list] = {}
    for card in load_deck():
        by_notebook.setdefault(card.notebook_folder, []).append(card)
    due, new = {}, {}
    for notebook, cards in by_notebook.items():
        queue = build_queue(cards, states, now=now, day_end=day_end, new_left=0)
        due[notebook] = queue.counts.learning + queue.counts.review
        new[notebook] = sum(c.card_id not in states for c in cards)
    return due, new, bool(states)


# ---------------------------------------------------------------------- command ---
def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "progress",
        help="per notebook: exercises passed in the last grade and check, flashcards due",
        description=(
            "Per notebook of the course: the exercises passed in the newest `distlab grade` "
            "and `distlab.check` of each, when, and the flashcards due. It reads only what "
            "those tools recorded in your data folder."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument(
        "--data", help="the data folder holding the grades (default: $DISTLAB_DATA_DIR or "
        "the user data folder)",
    )  # fmt: skip
    parser.add_argument(
        "--db", help="the flashcards review store (default: $DISTLAB_FLASHCARDS_DB or the "
        "user data folder)",
    )  # fmt: skip
    parser.set_defaults(func=_main)


def _main(args) -> int:
    table = progress_table(args.data, args.db)
    print(json.dumps(table.as_json(), indent=2) if args.json else str(table))
    return 0
