"""A grade and how it reads: points per exercise, failures, and the flashcards to review.

Both ways of grading (the whole notebook, :mod:`distlab.grading.whole`, and one
exercise, :mod:`distlab.grading.exercise`) return a :class:`NotebookGrade`;
:func:`format_report` writes it for the terminal and :func:`as_json` for ``--json``.

Each graded test cell of a source notebook may carry ``metadata.distlab``:
``{"exercise": "<title>", "flashcards": "<notebook>#<section>"}``; a failed
exercise then suggests ``flashcards drill --notebook <notebook>#<section>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from flashcards.model import load_deck


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
    kept: str | None = None  # where ``--keep`` wrote the learner's graded copy
    release: list[str] = field(default_factory=list)  # a copy from an older release: what changed

    @property
    def points(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        return sum(e.max_points for e in self.exercises)


def modified_time(path: Path) -> str:
    """The file's modification time, local, as :attr:`NotebookGrade.modified` shows it."""
    return datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")


def flashcard_suggestions(grade: NotebookGrade) -> list[tuple[str, int]]:
    """(section, number of cards in the deck) for each failed exercise, once per section."""
    sections = []
    for exercise in grade.exercises:
        if not exercise.passed and exercise.flashcards and exercise.flashcards not in sections:
            sections.append(exercise.flashcards)
    if not sections:
        return []
    deck = load_deck()
    return [(s, len(deck.filter(notebook=s))) for s in sections]


def format_report(grade: NotebookGrade) -> str:
    lines = [f"{grade.assignment}: {grade.points:g} / {grade.max_points:g} points"]
    if grade.path:
        lines.append(f"graded {grade.path} (modified {grade.modified})")
    if grade.note:
        lines.append(f"note: {grade.note}")
    if grade.kept:
        lines.append(f"your graded copy (outputs and results, no hidden tests): {grade.kept}")
    if grade.edited_test_cells:
        lines.append(
            f"note: {len(grade.edited_test_cells)} read-only test cell(s) were edited "
            f"({', '.join(grade.edited_test_cells)}); they were graded with the original tests."
        )
    lines += [f"note: {problem}" for problem in grade.problems]
    if grade.release:
        lines.append(f"note: {grade.release[0]}")
        lines += [f"      {line}" for line in grade.release[1:]]
    width = max((len(e.title) for e in grade.exercises), default=0)
    for e in grade.exercises:
        lines += _exercise_lines(e, width, e.grade_id in grade.edited_test_cells)
    suggestions = flashcard_suggestions(grade)
    if suggestions:
        lines.append("Review the topics you missed:")
        for section, n_cards in suggestions:
            count = f"   ({n_cards} card{'' if n_cards == 1 else 's'})"
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


def as_json(grade: NotebookGrade) -> dict:
    """The grade as ``distlab grade --json`` prints it."""
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
        "kept": grade.kept,
        "release": grade.release,
        "exercises": [e.__dict__ for e in grade.exercises],
    }
