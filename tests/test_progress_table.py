"""``distlab progress`` and ``distlab.progress_table()`` (issue 42): per notebook, the
exercises passed in the newest grade and check, when, and the flashcards due; and the
records ``distlab grade`` and ``distlab.check`` write for it (:mod:`distlab.grading.record`).

Everything here reads a temporary data folder with records written by the recording
functions themselves, and a temporary review store filled by a real drill session.
"""

from __future__ import annotations

import functools
import json
import threading
from datetime import UTC, datetime

import pytest

from distlab import cli
from distlab.commands.progress import START_HERE, progress_table
from distlab.grading.record import (
    CHECKED,
    DATA_ENV_VAR,
    GRADED,
    RecordError,
    read_records,
    record,
    record_quietly,
    records_dir,
)
from distlab.grading.report import ExerciseScore, NotebookGrade
from flashcards.model import load_deck

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def data(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "data"))
    return tmp_path / "data"


def grade(assignment: str, *scores: tuple[str, float, float]) -> NotebookGrade:
    exercises = [ExerciseScore(g, g.removeprefix("test-"), p, m, None, None) for g, p, m in scores]
    return NotebookGrade(assignment, assignment, exercises, path=f"/work/{assignment}.ipynb")


def fill_records():
    """02 graded whole (2 of 3 passed), then exercise 3 graded alone (passed); 00 checked."""
    whole = grade("02-collectives", ("test-ring-reduce-scatter", 3, 3),
                  ("test-ring-all-gather", 2, 2), ("test-ring-all-reduce", 0, 2))  # fmt: skip
    record(whole, GRADED, "notebook", at="2025-04-30T09:00:00+00:00")
    alone = grade("02-collectives", ("test-ring-all-reduce", 2, 2))
    record(alone, GRADED, "exercise", at="2025-04-30T10:30:00+00:00")
    checked = grade("00-launching", ("test-pass-token", 1, 2))
    record(checked, CHECKED, "check", at="2025-05-01T11:00:00+00:00", seconds=0.4)


def drill(db):
    """Two cards of 02 reviewed at NOW: one Good (learning, due in minutes: due today),
    one Easy (review, due in days: not due)."""
    from fsrs import Rating

    from flashcards.session import DrillSession

    session = DrillSession(store=db, notebook="02-collectives", clock=lambda: NOW)
    session.rate(Rating.Good)
    session.rate(Rating.Easy)
    session.store.close()


@functools.cache
def cards_in(notebook: str) -> int:
    return sum(c.notebook_folder == notebook for c in load_deck())


def test_the_table_shows_grades_checks_and_cards_due_per_notebook(tmp_path):
    fill_records()
    db = tmp_path / "reviews.sqlite3"
    drill(db)
    table = progress_table(db=db, now=NOW)
    rows = {r.notebook: r for r in table.rows}
    nb02, nb00, nb03 = rows["02-collectives"], rows["00-launching"], rows["03-algorithms-and-cost"]
    assert nb02.graded.cell() == "3/3 passed, 2025-04-30 10:30"  # exercise 3 graded alone later
    assert nb02.checked.cell() == "-"
    assert nb00.checked.cell() == "0/2 passed (1 run), 2025-05-01 11:00"
    assert nb00.graded.cell() == "-"
    assert (nb02.cards_due, nb02.cards_new) == (1, cards_in("02-collectives") - 2)
    assert nb02.cards() == f"1 due, {cards_in('02-collectives') - 2} new"
    assert (nb03.cards_due, nb03.cards_new) == (0, cards_in("03-algorithms-and-cost"))
    assert [r.notebook for r in table.rows][:3] == ["00-launching", "01-memory-anatomy",
                                                    "02-collectives"]  # fmt: skip
    text = str(table)
    assert "02-collectives" in text and "3/3 passed, 2025-04-30 10:30" in text
    page = table._repr_html_()
    assert page.startswith("<table>") and "<td style='text-align:left'>02-collectives</td>" in page
    assert "not a grade" in page


def test_the_command_prints_the_table_and_json(tmp_path, capsys):
    fill_records()
    db = tmp_path / "reviews.sqlite3"
    assert cli.main(["progress", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "distlab progress" in out and "0/2 passed (1 run)" in out
    assert not db.exists()  # reading progress creates no review store
    assert cli.main(["progress", "--db", str(db), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    nb02 = next(n for n in shown["notebooks"] if n["notebook"] == "02-collectives")
    assert nb02["graded"] == {"passed": 3, "recorded": 3, "exercises": 3,
                              "at": "2025-04-30T10:30:00+00:00"}  # fmt: skip


def test_with_nothing_recorded_it_says_how_to_start(tmp_path, capsys, data):
    db = tmp_path / "none.sqlite3"
    table = progress_table(db=db)
    assert table.empty
    assert str(table) == START_HERE.format(where=records_dir())
    assert "distlab grade 00" in str(table) and "distlab.check(1)" in str(table)
    assert "<table>" not in table._repr_html_() and "flashcards drill" in table._repr_html_()
    assert cli.main(["progress", "--db", str(db)]) == 0
    assert "Nothing recorded yet" in capsys.readouterr().out
    assert not db.exists() and not data.exists()


def test_distlab_grade_records_each_exercise_as_graded(monkeypatch, capsys):
    from distlab.grading import command

    one = grade("02-collectives", ("test-ring-all-gather", 2, 2))
    monkeypatch.setattr(command, "grade_exercise", lambda *args: one)
    assert cli.main(["grade", "02", "--exercise", "2"]) == 0
    recorded = read_records()["02-collectives"]
    assert recorded[GRADED]["test-ring-all-gather"]["how"] == "exercise"
    assert recorded[GRADED]["test-ring-all-gather"]["path"] == "/work/02-collectives.ipynb"
    assert recorded[CHECKED] == {}
    assert "Ring all-gather" not in capsys.readouterr().err


def test_a_damaged_record_is_named_and_kept_and_costs_the_grade_nothing(data):
    folder = records_dir()
    folder.mkdir(parents=True)
    (folder / "02-collectives.json").write_text("[1, 2")
    with pytest.raises(RecordError, match="02-collectives.json is not a distlab grade record"):
        read_records()
    problem = record_quietly(grade("02-collectives", ("t", 1, 1)), GRADED, "notebook")
    assert problem.startswith("not recorded for `distlab progress`") and DATA_ENV_VAR in problem
    assert (folder / "02-collectives.json").read_text() == "[1, 2"
    with pytest.raises(ValueError, match="kind must be one of"):
        record(grade("02-collectives", ("t", 1, 1)), "official", "notebook")


def test_writes_at_once_lose_nothing_and_leave_no_temporary_file():
    def write(k: int) -> None:
        for i in range(10):
            record(grade("04-data-parallelism", (f"t{k}-{i}", 1, 1)), CHECKED, "check")

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(read_records()["04-data-parallelism"][CHECKED]) == 40
    assert sorted(p.name for p in records_dir().iterdir()) == [
        "04-data-parallelism.json", "04-data-parallelism.json.lock"
    ]  # fmt: skip
