"""Links from the course notebooks to the cards, for ``distlab grade``.

When an exercise fails, the grader knows its notebook (and section); these functions
turn that into what to drill::

    >>> import flashcards
    >>> flashcards.tags_for_notebook("02-collectives")
    ['collectives']
    >>> flashcards.drill_command(notebook="02-collectives#all-reduce")
    "flashcards drill --notebook '02-collectives#all-reduce'"

``notebook`` is a folder (every section) or a ``folder#section`` anchor, matched the way
``flashcards drill --notebook`` matches it.
"""

from __future__ import annotations

import shlex

from flashcards.model import DIFFICULTIES, Card, Deck, load_deck


def cards_for_notebook(notebook: str, deck: Deck | None = None) -> list[Card]:
    """Cards whose ``notebook`` field is in this notebook folder (or is this anchor)."""
    deck = deck if deck is not None else load_deck()
    return deck.filter(notebook=notebook)


def tags_for_notebook(
    notebook: str, deck: Deck | None = None, *, include_difficulty: bool = False
) -> list[str]:
    """Sorted tags of the cards that a notebook (or one of its sections) teaches.

    Difficulty tags (basic/core/advanced) are left out unless asked for: they cut across
    topics and would drill the whole deck.
    """
    tags = {t for card in cards_for_notebook(notebook, deck) for t in card.tags}
    if not include_difficulty:
        tags -= set(DIFFICULTIES)
    return sorted(tags)


def drill_command(*, notebook: str | None = None, tag: str | None = None) -> str:
    """The terminal command that drills these cards."""
    if notebook is None and tag is None:
        raise ValueError("give a notebook, a tag or both")
    parts = ["flashcards", "drill"]
    if tag is not None:
        parts += ["--tag", tag]
    if notebook is not None:
        parts += ["--notebook", notebook]
    return shlex.join(parts)
