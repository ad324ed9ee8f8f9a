"""Deck loading and validation: good decks load, bad ones name file, card and field."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from flashcards.model import DECK_ENV_VAR, DeckError, card_id_for, load_card_file, load_deck

TEST_DECK = Path(__file__).parent / "data" / "deck"

GOOD_CARD = """\
  - id: {id}
    tags: [{topic}, basic]
    notebook: "02-collectives#all-reduce"
    q: What is it?
    a: It is 42.
"""


def write_topic(folder: Path, topic: str, cards: str) -> Path:
    path = folder / f"{topic}.yaml"
    path.write_text(f"topic: {topic}\ntitle: A title\ncards:\n{cards}", encoding="utf-8")
    return path


def test_test_deck_loads_in_file_order_with_stable_ids():
    deck = load_deck(TEST_DECK)
    assert [c.slug for c in deck][:2] == ["arith-ring-steps", "arith-ring-volume"]
    assert len(deck) == 6
    card = deck.by_slug("arith-sqrt-two")
    assert card.card_id == card_id_for("arith-sqrt-two")
    assert card.difficulty == "advanced" and card.topic == "arithmetic"
    assert card.checks[0].rel_tol == 0.001 and card.checks[0].value == 1.414
    assert deck.by_slug("words-zero").checks == ()
    assert deck.by_id(card.card_id) is card


def test_card_ids_are_stable_positive_and_fit_json():
    # Pinned: the first 13 hex digits (52 bits) of sha256("distlab:" + slug). Changing the
    # hash would orphan every learner's review history.
    assert card_id_for("coll-allreduce-start-end") == 0x3F920CB05C77E
    ids = {card_id_for(f"card-{i}") for i in range(5000)}
    assert len(ids) == 5000
    assert all(0 < i < 2**52 for i in ids)
    assert card_id_for("a") != card_id_for("b")


def test_filter_by_tag_and_notebook():
    deck = load_deck(TEST_DECK)
    assert {c.slug for c in deck.filter(tag="words")} == {
        "words-all-gather",
        "words-reduce-scatter",
        "words-zero",
    }
    assert {c.slug for c in deck.filter(notebook="02-collectives")} == {
        "arith-ring-steps",
        "arith-ring-volume",
        "words-all-gather",
        "words-reduce-scatter",
    }
    assert [c.slug for c in deck.filter(notebook="02-collectives#all-gather")] == [
        "words-all-gather"
    ]
    assert [c.slug for c in deck.filter(tag="basic", notebook="06-zero-and-fsdp")] == []


def test_duplicate_id_across_files_names_both_files(tmp_path):
    write_topic(tmp_path, "alpha", GOOD_CARD.format(id="same-id", topic="alpha"))
    write_topic(
        tmp_path,
        "beta",
        GOOD_CARD.format(id="other", topic="beta") + GOOD_CARD.format(id="same-id", topic="beta"),
    )
    with pytest.raises(DeckError) as err:
        load_deck(tmp_path)
    message = str(err.value)
    assert "duplicate card id 'same-id'" in message
    assert "alpha.yaml (card #1)" in message and "beta.yaml (card #2)" in message


def test_duplicate_id_within_a_file(tmp_path):
    path = write_topic(tmp_path, "alpha", GOOD_CARD.format(id="x", topic="alpha") * 2)
    with pytest.raises(DeckError, match=r"alpha.yaml: duplicate card id 'x' \(cards #1 and #2\)"):
        load_card_file(path)


@pytest.mark.parametrize(
    ("card", "field", "words"),
    [
        ("  - id: Bad Id\n    q: x\n", "'id'", "slug"),
        (
            "  - id: c1\n    tags: [alpha]\n    notebook: '02-collectives'\n    q: x\n    a: y\n",
            "'tags'",
            "difficulty",
        ),
        (
            "  - id: c1\n    tags: [core, alpha]\n    notebook: '02-collectives'\n    q: x\n    a: y\n",
            "'tags'",
            "topic tag",
        ),
        (
            "  - id: c1\n    tags: [alpha, 'has space', core]\n    notebook: '02-collectives'\n    q: x\n    a: y\n",
            "'tags'",
            "without spaces",
        ),
        (
            "  - id: c1\n    tags: [alpha, core]\n    notebook: '99-nowhere#x'\n    q: x\n    a: y\n",
            "'notebook'",
            "folder",
        ),
        (
            "  - id: c1\n    tags: [alpha, core]\n    notebook: '02-collectives'\n    q: x\n",
            "'a'",
            "non-empty",
        ),
        (
            "  - id: c1\n    tags: [alpha, core]\n    notebook: '02-collectives'\n    q: x\n    a: y\n    anwser: z\n",
            "'anwser'",
            "not a card field",
        ),
        (
            (
                "  - id: c1\n    tags: [alpha, core]\n    notebook: '02-collectives'\n    q: x\n    a: 'is 3'\n"
                "    checks:\n      - {expr: '1 +', value: 3, text: '3'}\n"
            ),
            "'checks[0].expr'",
            "not a valid expression",
        ),
        (
            (
                "  - id: c1\n    tags: [alpha, core]\n    notebook: '02-collectives'\n    q: x\n    a: 'is 3'\n"
                "    checks:\n      - {expr: '1 + 2', value: three, text: '3'}\n"
            ),
            "'checks[0].value'",
            "finite number",
        ),
        (
            (
                "  - id: c1\n    tags: [alpha, core]\n    notebook: '02-collectives'\n    q: x\n    a: 'is 3'\n"
                "    checks:\n      - {expr: '1 + 2', value: 3, text: 'three'}\n"
            ),
            "'checks[0].text'",
            "appears in neither",
        ),
        (
            (
                "  - id: c1\n    tags: [alpha, core]\n    notebook: '02-collectives'\n    q: x\n    a: 'is 3'\n"
                "    checks:\n      - {expr: '1 + 2', value: 3, text: '3', rel_tol: 2}\n"
            ),
            "'checks[0].rel_tol'",
            "(0, 1)",
        ),
    ],
)
def test_malformed_card_names_file_card_and_field(tmp_path, card, field, words):
    path = write_topic(tmp_path, "alpha", GOOD_CARD.format(id="fine", topic="alpha") + card)
    with pytest.raises(DeckError) as err:
        load_deck(tmp_path)
    message = str(err.value)
    assert str(path) in message
    assert "#2" in message  # the second card, by position (and by id once the id is readable)
    assert field in message
    assert words in message


def test_file_level_errors_name_the_file(tmp_path):
    path = tmp_path / "alpha.yaml"
    path.write_text("topic: beta\ntitle: t\ncards: []\n")
    with pytest.raises(DeckError, match="alpha.yaml: field 'topic' is 'beta'"):
        load_deck(tmp_path)
    path.write_text("topic: alpha\ntitle: t\ncards:\n  - id: [unclosed\n")
    with pytest.raises(DeckError, match="alpha.yaml: not valid YAML"):
        load_deck(tmp_path)
    path.write_text(textwrap.dedent("topic: alpha\ntitle: t\ncards: {}\n"))
    with pytest.raises(DeckError, match="field 'cards' must be a list"):
        load_deck(tmp_path)
    with pytest.raises(DeckError, match="no such deck folder"):
        load_deck(tmp_path / "missing")


def test_a_file_that_is_not_utf8_is_named_with_the_byte(tmp_path, monkeypatch, capsys):
    """Issue 30: a Latin-1 card file raised a bare UnicodeDecodeError naming no file."""
    write_topic(tmp_path, "alpha", GOOD_CARD.format(id="fine", topic="alpha"))
    path = write_topic(tmp_path, "beta", GOOD_CARD.format(id="bad", topic="beta"))
    raw = path.read_bytes().replace(b"It is 42.", "It is 42 \u00b0C.".encode("latin-1"))
    path.write_bytes(raw)
    offset = raw.index(b"\xb0")
    message = f"beta.yaml: not UTF-8 text: byte {offset} (line 8) is 0xb0"
    with pytest.raises(DeckError, match=re.escape(message)):
        load_deck(tmp_path)
    # the command says the same, through --deck and through $DISTLAB_FLASHCARDS_DECK
    from flashcards.cli import main

    assert main(["list", "--deck", str(tmp_path), "--db", str(tmp_path / "r.db")]) == 2
    assert message in capsys.readouterr().err
    monkeypatch.setenv(DECK_ENV_VAR, str(tmp_path))
    assert main(["list", "--db", str(tmp_path / "r.db")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("cards", "words"),
    [
        (
            GOOD_CARD.format(id="twice", topic="alpha") + "    a: It is 43.\n",
            "card 'twice' (#1): field 'a' appears twice (lines 8 and 9)",
        ),
        (
            GOOD_CARD.format(id="first", topic="alpha")
            + GOOD_CARD.format(id="second", topic="alpha").replace(
                "    q: What", '    notebook: "03-algorithms-and-cost"\n    q: What'
            ),
            "card 'second' (#2): field 'notebook' appears twice (lines 11 and 12)",
        ),
        (
            GOOD_CARD.format(id="checked", topic="alpha")
            + '    checks:\n      - {expr: "6 * 7", value: 42, expr: "40", text: "42"}\n',
            "card 'checked' (#1): field 'checks[0].expr' appears twice (both on line 10)",
        ),
        (
            "  - id: first\n    id: renamed\n" + GOOD_CARD.format(id="x", topic="alpha")[9:],
            "card 'first' (#1): field 'id' appears twice (lines 4 and 5)",
        ),
    ],
)
def test_a_repeated_key_is_refused_with_file_card_and_key(tmp_path, cards, words):
    """Issue 30: YAML keeps the last of two equal keys without a word; the deck refuses it."""
    write_topic(tmp_path, "alpha", cards)
    with pytest.raises(DeckError) as error:
        load_deck(tmp_path)
    assert f"alpha.yaml: {words}" in str(error.value)


def test_a_repeated_top_level_key_is_refused(tmp_path):
    path = tmp_path / "alpha.yaml"
    path.write_text("topic: alpha\ntitle: one\ntitle: two\ncards: []\n", encoding="utf-8")
    with pytest.raises(DeckError, match="alpha.yaml: top-level field 'title' appears twice"):
        load_deck(tmp_path)


# ------------------------------------------------------------------ cloze notes ---
CLOZE_NOTE = r"""  - id: ring-cost
    type: cloze
    tags: [alpha, core]
    notebook: "03-algorithms-and-cost#ring"
    text: |
      Ring all-reduce on $n$ ranks: {{c1::$2(n-1)$}} steps, each rank sends
      {{c2::$2\frac{n-1}{n}N$::bytes}}; {{c1::$n-1$}} of them reduce.
    extra: Thakur et al. 2005.
    checks:
      - {expr: "2 * (8 - 1)", value: 14, text: "2(n-1)"}
"""


def test_cloze_note_becomes_one_card_per_deletion(tmp_path):
    write_topic(tmp_path, "alpha", CLOZE_NOTE)
    first, second = load_deck(tmp_path).cards
    assert (first.slug, second.slug) == ("ring-cost-c1", "ring-cost-c2")
    assert first.card_id == card_id_for("ring-cost-c1") and first.note == second.note == "ring-cost"
    assert first.kind == "cloze" and first.checks == second.checks and len(first.checks) == 1
    # c1 hides both of its deletions and shows c2's answer; the back bolds c1 and adds extra
    assert first.q.count("[...]") == 2 and r"$2\frac{n-1}{n}N$" in first.q
    assert "**$2(n-1)$**" in first.a and "**$n-1$**" in first.a
    assert first.a.endswith("Thakur et al. 2005.")
    assert "[bytes]" in second.q and "$2(n-1)$ steps" in second.q and "{{" not in second.q


def test_a_basic_card_keeps_its_note_and_kind(tmp_path):
    write_topic(tmp_path, "alpha", GOOD_CARD.format(id="plain", topic="alpha"))
    (card,) = load_deck(tmp_path).cards
    assert (card.kind, card.note, card.cloze) == ("basic", "plain", "")


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ("type: cloze\n    text: no deletion here", "'text'", "no cloze deletion"),
        ("type: cloze\n    text: '$x = {{c1::2}}$'", "'text'", "inside a formula"),
        ("type: cloze\n    text: '{{c1::a}}'\n    q: why?", "'q'", "not a field of a cloze"),
        ("type: basic\n    q: x\n    a: y\n    text: '{{c1::a}}'", "'text'", "not a field"),
        ("type: quiz\n    q: x\n    a: y", "'type'", "allowed"),
    ],
)
def test_malformed_cloze_names_the_field(tmp_path, entry, field, words):
    card = f"  - id: c1\n    tags: [alpha, core]\n    notebook: '02-collectives'\n    {entry}\n"
    write_topic(tmp_path, "alpha", card)
    with pytest.raises(DeckError) as err:
        load_deck(tmp_path)
    assert field in str(err.value) and words in str(err.value)


def test_cloze_notes_export_as_anki_cloze_notes(tmp_path):
    import sqlite3
    import zipfile

    from flashcards.anki import CLOZE_MODEL_ID, MODEL_ID, export_apkg, note_guid

    write_topic(tmp_path, "alpha", CLOZE_NOTE + GOOD_CARD.format(id="plain", topic="alpha"))
    deck = load_deck(tmp_path)
    (tmp_path / "out").mkdir()  # export_apkg creates no folder
    path = export_apkg(deck, tmp_path / "out" / "deck.apkg", timestamp=0)
    with zipfile.ZipFile(path) as z:
        (tmp_path / "collection.sqlite").write_bytes(z.read("collection.anki2"))
    conn = sqlite3.connect(tmp_path / "collection.sqlite")
    notes = conn.execute("SELECT guid, mid, flds FROM notes ORDER BY id").fetchall()
    cards = conn.execute("SELECT nid, ord FROM cards ORDER BY ord").fetchall()
    conn.close()
    assert [(n[0], n[1]) for n in notes] == [
        (note_guid(deck.by_slug("ring-cost-c1")), CLOZE_MODEL_ID),
        (note_guid(deck.by_slug("plain")), MODEL_ID),
    ]
    text, extra, notebook, note_id = notes[0][2].split("\x1f")
    assert "{{c1::\\(2(n-1)\\)}}" in text and "{{c2::" in text and "::bytes}}" in text
    assert "Thakur" in extra and note_id == "ring-cost" and notebook.endswith("#ring")
    assert sorted(ord_ for _, ord_ in cards) == [0, 0, 1]  # Anki: one card per cloze number
