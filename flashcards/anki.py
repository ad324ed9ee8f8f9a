"""Export the deck to an Anki package (``.apkg``) with genanki.

Re-importing an edited deck must update notes, not duplicate them. Anki matches notes by
GUID and note types/decks by id, so:

- the note type and deck ids below are fixed numbers, chosen once at random and never
  changed (genanki docs: "hard-code" them);
- each note's GUID is ``genanki.guid_for("distlab", slug)``: derived from the card's
  stable slug and a course namespace, never from its text.

Fields are HTML: Markdown rendered by :mod:`flashcards.render`, math between Anki's
MathJax delimiters ``\\(...\\)`` and ``\\[...\\]``. Tags are the card's tags (no spaces by
the deck format) plus ``notebook::<folder>``.

Cloze notes (``type: cloze`` in the deck) go out as notes of a Cloze note type
(``genanki.Model(..., model_type=genanki.Model.CLOZE)``, template ``{{cloze:Text}}``, as
genanki's own ``CLOZE_MODEL``): one note per deck entry, its GUID from the entry's id, and Anki
makes one card per deletion number, as :mod:`flashcards.model` does.
"""

from __future__ import annotations

import os
from pathlib import Path

import genanki

from flashcards.model import Card, Deck
from flashcards.render import to_html

GUID_NAMESPACE = "distlab"
MODEL_ID = 1295119756  # never change: Anki identifies the note type by it
DECK_ID = 1338964029  # never change: Anki identifies the deck by it
CLOZE_MODEL_ID = 1858039071  # never change: Anki identifies the cloze note type by it
DECK_NAME = "distlab: distributed training"
FIELDS = ("Front", "Back", "Notebook", "Id")
CLOZE_FIELDS = ("Text", "Back Extra", "Notebook", "Id")

_CSS = """.card { font-family: system-ui, sans-serif; font-size: 20px; text-align: left;
  color: black; background-color: white; max-width: 42em; margin: auto; }
.notebook { margin-top: 1.5em; font-size: 14px; color: #666; }
code, pre { font-size: 16px; }
table { border-collapse: collapse; } td, th { border: 1px solid #aaa; padding: 2px 6px; }"""


def note_guid(card: Card) -> str:
    """The Anki note GUID of a card (of its cloze note): stable across edits of its text."""
    return genanki.guid_for(GUID_NAMESPACE, card.note)


def anki_model() -> genanki.Model:
    return genanki.Model(
        MODEL_ID,
        "distlab card",
        fields=[{"name": name} for name in FIELDS],
        templates=[
            {
                "name": "Card 1",
                "qfmt": "{{Front}}",
                "afmt": '{{FrontSide}}<hr id="answer">{{Back}}<div class="notebook">{{Notebook}}</div>',
            }
        ],
        css=_CSS,
        sort_field_index=3,
    )


def anki_cloze_model() -> genanki.Model:
    return genanki.Model(
        CLOZE_MODEL_ID,
        "distlab cloze",
        fields=[{"name": name} for name in CLOZE_FIELDS],
        templates=[
            {
                "name": "Cloze",
                "qfmt": "{{cloze:Text}}",
                "afmt": '{{cloze:Text}}<br>{{Back Extra}}<div class="notebook">{{Notebook}}</div>',
            }
        ],
        css=_CSS + "\n.cloze { font-weight: bold; color: blue; }",
        model_type=genanki.Model.CLOZE,
        sort_field_index=3,
    )


def anki_note(card: Card, model: genanki.Model) -> genanki.Note:
    """The note of a basic card, or of the cloze note ``card`` belongs to (``model`` matching)."""
    tags = [*card.tags, f"notebook::{card.notebook_folder}"]
    if card.kind == "cloze":
        fields = [to_html(card.cloze), to_html(card.extra), card.notebook, card.note]
    else:
        fields = [to_html(card.q), to_html(card.a), card.notebook, card.slug]
    return genanki.Note(model=model, fields=fields, tags=tags, guid=note_guid(card))


def export_apkg(
    deck: Deck | list[Card], path: str | os.PathLike, *, timestamp: float | None = None
) -> Path:
    """Write every card of ``deck`` to an ``.apkg`` file; returns its path.

    The file's folder must exist: a missing one is a ``ValueError`` naming it (a typo in the
    path should not create folders)."""
    path = Path(path)
    if path.suffix != ".apkg":
        raise ValueError(f"Anki packages end in .apkg, got {path.name!r}")
    folder = path.parent
    if not folder.is_dir():
        problem = "is not a folder" if folder.exists() else "does not exist"
        raise ValueError(
            f"cannot write {path}: the folder {folder} {problem}; create it first or "
            "choose a path in an existing folder"
        )
    models = {"basic": anki_model(), "cloze": anki_cloze_model()}
    anki_deck = genanki.Deck(DECK_ID, DECK_NAME)
    notes_done: set[str] = set()
    for card in deck:
        if card.note in notes_done:  # a cloze note's other deletions: the same Anki note
            continue
        notes_done.add(card.note)
        anki_deck.add_note(anki_note(card, models[card.kind]))
    genanki.Package(anki_deck).write_to_file(str(path), timestamp=timestamp)
    return path
