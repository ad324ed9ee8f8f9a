"""distlab flashcards: drill the course's facts with FSRS spaced repetition.

In JupyterLab::

    import flashcards
    flashcards.drill()                   # new cards in course order, notebook 00 first
    flashcards.drill(up_to="02")         # only the notebooks done so far: 00, 01 and 02
    flashcards.drill(notebook="02-collectives")   # or tag="collectives"

In a terminal: ``flashcards drill --up-to 02``, ``flashcards stats``, ``flashcards export-anki deck.apkg``
(``flashcards --help`` lists every command). Imports are lazy: ``import flashcards`` loads
nothing heavy until a name is used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "drill": "flashcards.widget",
    "DrillWidget": "flashcards.widget",
    "DrillSession": "flashcards.session",
    "Card": "flashcards.model",
    "Deck": "flashcards.model",
    "DeckError": "flashcards.model",
    "load_deck": "flashcards.model",
    "card_id_for": "flashcards.model",
    "Store": "flashcards.store",
    "run_checks": "flashcards.checks",
    "export_apkg": "flashcards.anki",
    "compute_stats": "flashcards.stats",
    "cards_for_notebook": "flashcards.links",
    "tags_for_notebook": "flashcards.links",
    "drill_command": "flashcards.links",
}

__all__ = [
    "Card",
    "Deck",
    "DeckError",
    "DrillSession",
    "DrillWidget",
    "Store",
    "card_id_for",
    "cards_for_notebook",
    "compute_stats",
    "drill",
    "drill_command",
    "export_apkg",
    "load_deck",
    "run_checks",
    "tags_for_notebook",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flashcards' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
