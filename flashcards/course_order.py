"""Course order: new cards come in the order a learner meets them in the notebooks.

A card's ``notebook`` field (``"02-collectives#reduce-scatter"``) places it. Cards are
sorted by

1. the notebook, in course order (:data:`flashcards.model.NOTEBOOK_FOLDERS`, 00 to 12);
2. the section, in the order its heading appears in the notebook's source,
   ``solutions/NN-topic/NN-topic.ipynb`` (a card with no section, ``"03-algorithms-and-cost"``,
   comes first: it is about the notebook as a whole);
3. the deck's own order (files by name, cards as written), to break ties.

Notebooks not written yet (no source notebook in this checkout, or no checkout at all
when distlab is installed from a wheel) have no headings to read: their sections keep
the order in which the deck first mentions them, and a section that a notebook lacks
comes after that notebook's headings. So the order is always defined and stable, and it
becomes the notebook's own order as soon as the notebook is written.

A section anchor is the heading text in lower case, every run of other characters than
``a-z0-9`` turned into one ``-`` (``"## DP vs DDP"`` -> ``dp-vs-ddp``), as in the deck.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from distlab.core.course import find_course_root, source_notebook
from flashcards.model import NOTEBOOK_FOLDERS, Card

_HEADING = re.compile(r"^#+\s+(.+?)\s*#*\s*$", re.MULTILINE)


def section_anchor(heading: str) -> str:
    """The anchor a card uses for a Markdown heading: ``"Ring all-reduce"`` -> ``ring-all-reduce``."""
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def markdown_headings(text: str) -> list[str]:
    """The text of each Markdown heading line in ``text`` (``"## DP vs DDP"`` -> ``DP vs DDP``)."""
    return _HEADING.findall(text)


def notebook_headings(notebook_path: str | os.PathLike) -> dict[str, str]:
    """Section anchor -> heading text of a notebook's Markdown headings, in the order they
    appear (a repeated anchor keeps its first heading)."""
    cells = json.loads(Path(notebook_path).read_text(encoding="utf-8")).get("cells", [])
    headings: dict[str, str] = {}
    for cell in cells:
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        for heading in markdown_headings(text):
            anchor = section_anchor(heading)
            if anchor and anchor not in headings:
                headings[anchor] = heading
    return headings


def notebook_sections(notebook_path: str | os.PathLike) -> list[str]:
    """Section anchors of a notebook's Markdown headings, in the order they appear."""
    return list(notebook_headings(notebook_path))


def course_root() -> Path | None:
    """The course checkout (``$DISTLAB_COURSE_ROOT`` or the one distlab runs from), or None."""
    try:
        return find_course_root()
    except FileNotFoundError:
        return None


@lru_cache(maxsize=8)
def _sections_by_notebook(root: Path | None) -> dict[str, tuple[str, ...]]:
    if root is None:
        return {}
    found = {}
    for folder in NOTEBOOK_FOLDERS:
        path = source_notebook(root, folder)
        if path.is_file():
            found[folder] = tuple(notebook_sections(path))
    return found


def course_sort_key(
    cards: Iterable[Card], root: str | os.PathLike | None = None
) -> dict[int, tuple[int, int, int]]:
    """``card_id -> (notebook rank, section rank, deck position)`` for ``cards``.

    ``root``: the course checkout whose ``solutions/`` notebooks give the section order
    (default: :func:`course_root`).
    """
    cards = list(cards)
    sections = _sections_by_notebook(Path(root).resolve() if root is not None else course_root())
    ranks: dict[str, dict[str, int]] = {}
    for folder, anchors in sections.items():
        ranks[folder] = {anchor: i + 1 for i, anchor in enumerate(anchors)}
    keys = {}
    for position, card in enumerate(cards):
        folder, _, section = card.notebook.partition("#")
        in_notebook = ranks.setdefault(folder, {})
        if section and section not in in_notebook:  # not written yet: deck order
            in_notebook[section] = len(in_notebook) + 1
        keys[card.card_id] = (
            NOTEBOOK_FOLDERS.index(folder),
            in_notebook[section] if section else 0,
            position,
        )
    return keys


def in_course_order(cards: Iterable[Card], root: str | os.PathLike | None = None) -> list[Card]:
    """``cards`` sorted by notebook, then section as the notebook presents it (see module)."""
    cards = list(cards)
    keys = course_sort_key(cards, root)
    return sorted(cards, key=lambda card: keys[card.card_id])


def notebook_prefix(up_to: str | int) -> int:
    """The course position of ``up_to``: ``"03"``, ``3`` or ``"03-algorithms-and-cost"`` -> 3."""
    allowed = (
        f"a notebook number 0-{len(NOTEBOOK_FOLDERS) - 1} (e.g. '03') "
        f"or a folder of {', '.join(NOTEBOOK_FOLDERS)}"
    )
    if isinstance(up_to, bool) or not isinstance(up_to, str | int):
        raise TypeError(f"up_to (--up-to) must be {allowed}, got {up_to!r}")
    text = str(up_to).strip()
    if text in NOTEBOOK_FOLDERS:
        return NOTEBOOK_FOLDERS.index(text)
    if text.isdigit() and int(text) < len(NOTEBOOK_FOLDERS):
        return int(text)
    raise ValueError(f"up_to (--up-to) must be {allowed}, got {up_to!r}")


def up_to_notebook(cards: Iterable[Card], up_to: str | int) -> list[Card]:
    """The cards of notebooks 00 to ``up_to`` included: what a learner has met so far."""
    last = notebook_prefix(up_to)
    return [c for c in cards if NOTEBOOK_FOLDERS.index(c.notebook_folder) <= last]
