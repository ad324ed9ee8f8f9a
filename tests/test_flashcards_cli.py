"""The flashcards command: piped drill, stats and plot, list, check, Anki and JSON exports."""

from __future__ import annotations

import io
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import genanki
import pytest
from rich.console import Console

from flashcards.anki import DECK_ID, MODEL_ID, export_apkg, note_guid
from flashcards.cli import key_reader, main
from flashcards.course_order import in_course_order
from flashcards.model import default_deck_dir, load_deck
from flashcards.render import split_math
from flashcards.store import Store

TEST_DECK = Path(__file__).parent / "data" / "deck"
NOW = "2025-03-03T12:00:00+00:00"


def run(args, stdin: str = "", monkeypatch=None) -> tuple[int, str]:
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    out = io.StringIO()
    code = main(args, console=Console(file=out, width=100, color_system=None))
    return code, out.getvalue()


def test_piped_drill_shows_rates_and_quits(tmp_path, monkeypatch):
    db = str(tmp_path / "r.db")
    # Enter shows the answer, 3 = Good; "x" is not a rating and is asked again; 4 = Easy; q quits.
    code, out = run(
        ["drill", "--db", db, "--deck", str(TEST_DECK), "--now", NOW],
        "\n3\n\nx\n4\nq\n",
        monkeypatch,
    )
    assert code == 0
    assert "How many steps does a ring all-reduce" in out and "n = 8" in out
    assert "3 Good · 10m" in out and "1 Again, 2 Hard, 3 Good, 4 Easy" in out
    assert "Reviewed 2 card(s)" in out
    ratings = [int(r.rating) for r in Store(db).reviews()]
    assert ratings == [3, 4]


def test_piped_drill_undo_and_end_of_input(tmp_path, monkeypatch):
    db = str(tmp_path / "r.db")
    code, out = run(
        [
            "drill",
            "--db",
            db,
            "--deck",
            str(TEST_DECK),
            "--now",
            NOW,
            "--new",
            "1",
            "--tag",
            "arithmetic",
        ],
        "\n4\nu\n",
        monkeypatch,
    )
    assert code == 0 and "Undid the last review of arith-ring-steps" in out
    assert Store(db).reviews() == []  # EOF after the undo quits


def test_drill_filters_by_tag_and_reports_nothing_due(tmp_path, monkeypatch):
    db = str(tmp_path / "r.db")
    code, out = run(
        ["drill", "--db", db, "--deck", str(TEST_DECK), "--now", NOW, "--tag", "irrational"],
        "\n4\n",
        monkeypatch,
    )
    assert code == 0 and "square" not in out and "Nothing due now" in out
    assert [r.slug for r in Store(db).reviews()] == ["arith-sqrt-two"]
    code, _ = run(["drill", "--db", db, "--deck", str(TEST_DECK), "--tag", "nope"], "", monkeypatch)
    assert code == 2


def test_console_script_runs_with_piped_input(tmp_path):
    script = Path(sys.executable).parent / "flashcards"
    if not script.exists():
        pytest.skip("console script not installed")
    result = subprocess.run(
        [
            str(script),
            "drill",
            "--db",
            str(tmp_path / "r.db"),
            "--deck",
            str(TEST_DECK),
            "--now",
            NOW,
        ],
        input="\n2\nq\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Reviewed 1 card(s)" in result.stdout


def test_key_reader_falls_back_to_lines():
    read = key_reader(io.StringIO("\n 3\nquit\n"))
    assert [read(), read(), read(), read()] == ["\n", "3", "q", "q"]


def test_stats_and_plot(tmp_path, monkeypatch):
    db = str(tmp_path / "r.db")
    run(
        ["drill", "--db", db, "--deck", str(TEST_DECK), "--now", NOW],
        "\n4\n\n4\n\n1\nq\n",
        monkeypatch,
    )
    plot = tmp_path / "stats.png"
    code, out = run(
        ["stats", "--db", db, "--deck", str(TEST_DECK), "--now", NOW, "--plot", str(plot)]
    )
    assert code == 0
    assert "Due forecast" in out and "Reviews per day" in out and "true retention" in out
    assert "2025-03-03 │       3" in out  # three reviews today
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_list_and_unsuspend(tmp_path, monkeypatch):
    db = str(tmp_path / "r.db")
    drill = ["drill", "--db", db, "--deck", str(TEST_DECK), "--now", NOW, "--tag", "arithmetic"]
    run(drill, "\n4\nq\n", monkeypatch)
    code, out = run(["list", "--db", db, "--deck", str(TEST_DECK), "--tag", "arithmetic"])
    assert code == 0 and "arith-ring-steps" in out and "review" in out and "words-zero" not in out
    store = Store(db)
    card_id = load_deck(TEST_DECK).by_slug("arith-ring-steps").card_id
    store.set_suspended(card_id, True)
    assert "suspended" in run(["list", "--db", db, "--deck", str(TEST_DECK)])[1]
    assert run(["unsuspend", "arith-ring-steps", "--db", db, "--deck", str(TEST_DECK)])[0] == 0
    assert not store.card_state(card_id).suspended
    assert run(["unsuspend", "no-such-card", "--db", db, "--deck", str(TEST_DECK)])[0] == 2


def test_check_command(tmp_path):
    code, out = run(["check", "--deck", str(TEST_DECK)])
    assert code == 0 and "3 of 3 checks pass" in out
    bad = tmp_path / "arithmetic.yaml"
    bad.write_text((TEST_DECK / "arithmetic.yaml").read_text().replace("value: 14", "value: 15"))
    code, out = run(["check", "--deck", str(bad)])
    assert code == 1 and "arith-ring-steps" in out and "MISMATCH" in out and "2 of 3" in out


def test_json_export_import_commands(tmp_path, monkeypatch):
    db, other = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    run(["drill", "--db", db, "--deck", str(TEST_DECK), "--now", NOW], "\n3\n\n3\nq\n", monkeypatch)
    path = str(tmp_path / "h.json")
    assert run(["export-json", path, "--db", db]) == (0, f"wrote 2 reviews to {path}\n")
    assert run(["import-json", path, "--db", other])[0] == 0
    assert len(Store(other).reviews()) == 2
    assert run(["import-json", str(tmp_path / "missing.json"), "--db", other])[0] == 2


def read_apkg(path: Path) -> tuple[list[str], list[tuple], int]:
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        collection = next(n for n in names if n in ("collection.anki21", "collection.anki2"))
        data = z.read(collection)
    db_path = path.with_suffix(".sqlite")
    db_path.write_bytes(data)
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    notes = conn.execute("SELECT guid, mid, flds, tags FROM notes ORDER BY id").fetchall()
    cards = conn.execute("SELECT COUNT(*) FROM cards WHERE did = ?", (DECK_ID,)).fetchone()[0]
    conn.close()
    return names, notes, cards


def test_anki_package_holds_every_card_with_stable_guids(tmp_path):
    deck = load_deck(TEST_DECK)
    path = tmp_path / "deck.apkg"
    code, out = run(["export-anki", str(path), "--deck", str(TEST_DECK)])
    assert code == 0 and "wrote 6 notes" in out
    names, notes, cards = read_apkg(path)
    assert "collection.anki2" in names
    assert cards == len(deck) == len(notes)
    in_order = in_course_order(deck)
    assert [n[0] for n in notes] == [genanki.guid_for("distlab", c.slug) for c in in_order]
    assert {n[1] for n in notes} == {MODEL_ID}
    fields = {n[0]: n[2].split("\x1f") for n in notes}
    steps = fields[note_guid(deck.by_slug("arith-ring-steps"))]
    assert "\\(n = 8\\)" in steps[0] and "<strong>7</strong>" in steps[1]
    assert steps[2:] == ["02-collectives#ring-all-reduce", "arith-ring-steps"]
    tags = {n[0]: n[3].split() for n in notes}
    assert sorted(tags[note_guid(deck.by_slug("arith-sqrt-two"))]) == [
        "advanced",
        "arithmetic",
        "irrational",
        "notebook::03-algorithms-and-cost",
    ]


def test_editing_a_card_keeps_its_anki_guid(tmp_path):
    edited = tmp_path / "arithmetic.yaml"
    edited.write_text(
        (TEST_DECK / "arithmetic.yaml").read_text().replace("How many steps", "Count the steps")
    )
    _, before, _ = read_apkg(
        export_apkg(load_deck(TEST_DECK / "arithmetic.yaml"), tmp_path / "a.apkg")
    )
    _, after, _ = read_apkg(export_apkg(load_deck(edited), tmp_path / "b.apkg"))
    assert [n[0] for n in before] == [n[0] for n in after]
    assert before[0][2] != after[0][2]
    with pytest.raises(ValueError, match=r"\.apkg"):
        export_apkg(load_deck(edited), tmp_path / "deck.zip")


def test_real_deck_exports_to_anki(tmp_path):
    deck = load_deck(default_deck_dir())
    _, notes, cards = read_apkg(export_apkg(deck, tmp_path / "distlab.apkg"))
    assert cards == len(deck)  # a cloze note is one Anki note and one card per deletion
    assert len(notes) == len({n[0] for n in notes}) == len({card.note for card in deck})
    fronts = {n[0]: n[2].split("\x1f")[0] for n in notes}
    for card in deck:
        if any(kind != "text" for kind, _ in split_math(card.q)):
            assert "\\(" in fronts[note_guid(card)] or "\\[" in fronts[note_guid(card)], card.slug


def test_history_file_is_json(tmp_path, monkeypatch):
    db = str(tmp_path / "r.db")
    drill = ["drill", "--db", db, "--deck", str(TEST_DECK), "--now", NOW, "--tag", "arithmetic"]
    run(drill, "\n3\nq\n", monkeypatch)
    path = tmp_path / "h.json"
    run(["export-json", str(path), "--db", db])
    (review,) = json.loads(path.read_text())["reviews"]
    assert (
        review["slug"] == "arith-ring-steps"
        and review["rating"] == 3
        and review["state_before"] == 0
    )
    assert review["reviewed_at"] == NOW


def test_list_never_cuts_an_id_in_80_columns(tmp_path):
    out = io.StringIO()
    code = main(["list", "--db", str(tmp_path / "r.db")], console=Console(file=out, width=80))
    deck = load_deck(default_deck_dir())
    listed = {line.split()[0] for line in out.getvalue().splitlines() if line.strip()}
    assert code == 0 and {c.slug for c in deck} <= listed
    assert f"{len(deck)} cards" in out.getvalue()
    code, out = run(
        ["list", "--deck", str(TEST_DECK), "--db", str(tmp_path / "r.db"), "--tag", "irrational"]
    )
    assert code == 0 and out.split("\n")[0].strip() == "1 card"


def test_up_to_selects_the_notebooks_done_so_far(tmp_path, monkeypatch):
    db = str(tmp_path / "r.db")
    code, out = run(["list", "--db", db, "--deck", str(TEST_DECK), "--up-to", "02"])
    assert code == 0 and "4 cards" in out and "arith-sqrt-two" not in out
    assert out.index("words-reduce-scatter") < out.index("arith-ring-steps")  # course order
    code, out = run(
        ["drill", "--db", db, "--deck", str(TEST_DECK), "--up-to", "14"], "", monkeypatch
    )
    assert code == 2


def test_list_in_an_80_column_pipe_breaks_no_notebook_mid_word(tmp_path):
    """Issue 27: `COLUMNS=80 flashcards list | less` cut `07-tensor-an` / `d-sequence-p`.
    Through a real pipe, every notebook anchor is broken only after a `-` or before a `#`."""
    env = {**os.environ, "COLUMNS": "80"}
    env.pop("FORCE_COLOR", None)
    result = subprocess.run(
        [sys.executable, "-m", "flashcards.cli", "list", "--db", str(tmp_path / "r.db")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if line.lstrip().startswith("id"))
    assert "id / notebook" in header  # 80 columns: the notebook goes under the id
    first_column = slice(0, header.index("tags"))
    rows: list[list[str]] = []
    for line in lines[lines.index(header) + 2 :]:
        cell = line[first_column]
        if cell.startswith("  ") and not cell.startswith("   "):  # an id starts a row
            rows.append([cell.strip()])
        elif cell.strip():
            rows[-1].append(cell.strip())
    deck = {c.slug: c for c in load_deck(default_deck_dir())}
    assert [row[0] for row in rows] == [c.slug for c in in_course_order(deck.values())]
    for slug, *pieces in rows:
        assert "".join(pieces) == deck[slug].notebook, (slug, pieces)
        for piece, after in itertools.pairwise(pieces):
            assert piece.endswith("-") or after.startswith("#"), (slug, pieces)


@pytest.mark.parametrize("width", [8, 14, 20, 80])
def test_breakable_wraps_only_between_words(width):
    from flashcards.cli import Breakable

    text = "07-tensor-and-sequence-parallelism#column-row tensor-sequence core"
    lines = Breakable(text).lines(width)
    assert " ".join(lines).replace("- ", "-").replace(" #", "#") == text
    for line, after in itertools.pairwise(lines):
        assert line.endswith("-") or after.startswith("#") or text.find(f"{line} {after}") >= 0
    assert all(len(line) <= max(width, 12) for line in lines)  # "parallelism-" is one word
