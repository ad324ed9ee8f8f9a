"""The flashcard deck as site pages: an index, and one page of cards per notebook.

Read at build time from the deck itself (:func:`flashcards.model.load_deck`, the loader the
drill uses), so the pages always show the deck as it is. A page lists its notebook's cards in
course order (:func:`flashcards.course_order.in_course_order`), grouped by the section each
card points at, and links each section to its heading on the notebook's page: the link is the
card's own ``notebook#section`` anchor, written as a MyST link to the notebook, so a card
whose section is missing from the notebook shows as a broken reference in the build.

A cloze note is shown once, with its deletions in bold, where the drill makes one card of each.
"""

from __future__ import annotations

from pathlib import Path

from distlab.site.files import write_if_changed
from flashcards.course_order import in_course_order, notebook_headings
from flashcards.model import NOTEBOOK_FOLDERS, Card, Deck
from flashcards.render import CLOZE


def _answer_in_bold(cloze: str) -> str:
    """A cloze note's text with every deletion shown, in bold."""
    return CLOZE.sub(lambda m: f"**{m.group(2)}**", cloze)


def _notes(cards: list[Card]) -> list[Card]:
    """One card per deck entry: a cloze note's first card stands for the note."""
    seen, notes = set(), []
    for card in cards:
        if card.note not in seen:
            seen.add(card.note)
            notes.append(card)
    return notes


def card_markdown(card: Card) -> str:
    """One card as MyST Markdown: its id and tags, the question, the answer."""
    tags = ", ".join(card.tags)
    if card.kind == "cloze":
        body = [_answer_in_bold(card.cloze).strip()]
        if card.extra.strip():
            body += ["", card.extra.strip()]
    else:
        body = [f"**Q.** {card.q.strip()}", "", f"**A.** {card.a.strip()}"]
    return "\n".join([f"`{card.note}` ({tags})", "", *body, ""])


def notebook_deck_page(folder: str, cards: list[Card], headings: dict[str, str], title: str) -> str:
    """The page of ``folder``'s cards; ``headings``: the notebook's anchor -> heading text;
    ``title``: the notebook's title."""
    lines = [
        f"# Flashcards: {title}",
        "",
        (
            f"{len(_notes(cards))} cards. Drill them in a terminal with "
            f"`flashcards drill --notebook {folder}`, or in the notebook with "
            f'`flashcards.drill(notebook="{folder}")`.'
        ),
        "",
    ]
    sections: dict[str, list[Card]] = {}
    for card in _notes(cards):
        sections.setdefault(card.notebook.partition("#")[2], []).append(card)
    for section, in_section in sections.items():
        if section:
            heading = headings.get(section, section)
            link = f"../notebooks/{folder}.ipynb#{section}"
            lines += [f"## {heading}", "", f"Read it in [{folder}]({link}).", ""]
        else:
            lines += ["## The notebook as a whole", ""]
        lines.append("\n---\n\n".join(card_markdown(card) for card in in_section))
    return "\n".join(lines)


def index_page(counts: dict[str, int], titles: dict[str, str]) -> str:
    """The deck's landing page: how to drill, and one link per notebook."""
    lines = [
        "# Flashcards",
        "",
        (
            "The course's deck, by notebook. Each card points at the section of the notebook "
            "it comes from. Drill them with spaced repetition (FSRS) in a terminal "
            "(`flashcards drill --up-to 03` keeps to the notebooks done so far) or in a "
            'notebook (`flashcards.drill(up_to="03")`); `flashcards export-anki deck.apkg` '
            "writes an Anki deck."
        ),
        "",
        "| notebook | cards |",
        "| --- | --- |",
    ]
    lines += [f"| [{titles[f]}]({f}.md) | {counts[f]} |" for f in counts]
    lines += ["", "```{toctree}", ":hidden:", "", *counts, "```", ""]
    return "\n".join(lines)


def write_deck_pages(
    deck: Deck, out: Path, notebooks: dict[str, Path], titles: dict[str, str]
) -> list[Path]:
    """Write ``index.md`` and ``<folder>.md`` for each notebook that has cards into ``out``.

    ``notebooks``: folder -> its notebook (for the section headings); ``titles``: folder ->
    the notebook's title."""
    ordered = in_course_order(deck.cards)
    counts, written = {}, []
    for folder in NOTEBOOK_FOLDERS:
        cards = [c for c in ordered if c.notebook_folder == folder]
        if not cards or folder not in notebooks:
            continue
        counts[folder] = len(_notes(cards))
        headings = notebook_headings(notebooks[folder])
        page = notebook_deck_page(folder, cards, headings, titles[folder])
        written.append(write_if_changed(out / f"{folder}.md", page))
    return [write_if_changed(out / "index.md", index_page(counts, titles)), *written]
