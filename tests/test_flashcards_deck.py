"""The real course deck (flashcards/deck/*.yaml): valid, unique ids, every number recomputed.

Each numeric check is its own test, named ``test_deck_number[<card-id>#<n>]``; a failure
prints the file, the card, the expression, what distlab computed and what the card states.
Run only these with ``pytest tests/test_flashcards_deck.py``.
"""

from __future__ import annotations

import pytest

from flashcards.checks import run_check
from flashcards.model import DeckError, card_id_for, default_deck_dir, load_deck

MIN_CARDS = 150  # issue 6: "at least 150 cards"


def _load():
    try:
        return load_deck(default_deck_dir()), None
    except DeckError as exc:
        return None, exc


DECK, DECK_ERROR = _load()
CHECKS = (
    []
    if DECK is None
    else [(card, i, check) for card in DECK for i, check in enumerate(card.checks)]
)


def test_deck_is_valid():
    assert DECK_ERROR is None, f"the course deck does not load: {DECK_ERROR}"
    assert len(DECK) >= MIN_CARDS, (
        f"the deck has {len(DECK)} cards; the course needs at least {MIN_CARDS}"
    )
    slugs = [c.slug for c in DECK]
    assert len(set(slugs)) == len(slugs)
    assert len({card_id_for(s) for s in slugs}) == len(slugs)
    assert set(DECK.titles) == {p.stem for p in default_deck_dir().glob("*.yaml")}


def test_every_stated_text_is_in_its_card():
    assert DECK is not None, DECK_ERROR
    missing = [
        f"{card.source} {card.slug}: {check.text!r}"
        for card, _, check in CHECKS
        if not any(check.text in text for text in (card.q, card.a, card.cloze))
    ]
    assert not missing, "check texts not found in q or a:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("card", "index", "check"), CHECKS, ids=[f"{c.slug}#{i}" for c, i, _ in CHECKS]
)
def test_deck_number(card, index, check):
    result = run_check(card, check)
    if not result.ok:
        pytest.fail(result.message(), pytrace=False)
