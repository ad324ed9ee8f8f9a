"""Paper citations in prose, and whether each names the place in the paper it relies on.

A reader who wants to check a claim needs more than "Narayanan et al. 2021": the section,
table, figure or equation. This module finds the citations the project writes and says
whether their sentence names such a place. Two things count as a citation:

* an author and a year, as the course writes them: ``Narayanan et al. 2021``,
  ``(Rajbhandari et al., 2020)``, ``Patarasuk and Yuan 2009``, ``Thakur, Rabenseifner &
  Gropp 2005``, ``Gropp 2005``, ``Young (1974)``; a venue and year in the place of the
  author (``Dean and Barroso ("The Tail at Scale", CACM 2013)``) is the same citation;
* an arXiv identifier (``arXiv:2104.04473``).

A *place* (:data:`PLACE`) is ``§3.1``, ``Section 3.1``, ``Sections 2.1 and 2.2``, ``Table 1``,
``Table D.1``, ``Figure 3``, ``Fig. 3``, ``Eq. (4)``, ``Equation 4``, ``Appendix B``,
``Algorithm 1``, ``Part 5``, ``p. 7``, the abstract, or a file of the source's code
(``src/include/device.h``); it counts when it is in the same sentence as the citation
(sentences as :func:`sentence_spans` cuts them). :mod:`distlab.site.stated_numbers` uses the
same :data:`PLACE` to decide that a number is *cited*. ``tests/test_citations.py`` runs
:func:`citations` over the docstrings and comments of ``distlab/``, every cell of the
solution notebooks and every card of the deck; this module's own examples above are not
citations, and that test skips it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a surname: a capital, then letters, apostrophes or hyphens (``Lamy-Poirier``, ``DeepSeek-AI``)
_NAME = r"[A-Z][A-Za-z'’-]+"
#: an author-year citation, or an arXiv identifier
CITATION = re.compile(
    rf"\b{_NAME}(?:\s+et\s+al\.?|(?:,?\s+(?:and|&)\s+{_NAME}))?,?\s+\(?(?:19|20)\d\d[a-z]?\b"
    r"(?![.,]?\d)|\barXiv:?\s?\d{4}\.\d{4,5}"
)
#: a place in a source: section, table, figure, equation, appendix, algorithm, part, page
PLACE = re.compile(
    r"§ ?\d+(?:\.\d+)*"
    r"|\b(?:Sections?|Sec\.|Tables?|Tab\.|Figures?|Figs?\.|Equations?|Eqs?\.|Algorithms?|Part"
    r"|pp?\.) ?\(?(?:[A-Z]\.?)?\d+(?:\.\d+)*"
    r"|\bAppendi(?:x|ces) [A-Z0-9]\b|\babstract\b"
    r"|`[\w.-]+(?:/[\w.-]+)+\.(?:h|hpp|c|cc|cu|cuh|py|rs|md)`",
    re.IGNORECASE,
)
#: words that end with a period without ending a sentence
_ABBREVIATIONS = {"al", "e.g", "i.e", "fig", "figs", "eq", "eqs", "sec", "tab", "vs", "cf", "etc"}
_ABBREVIATIONS |= {"approx", "no", "p", "pp", "ref", "resp", "st", "dr", "v"}
#: where a sentence may end: a full stop, ? or !, then space and what can open a sentence;
#: a blank line; a new list item or table row
_BOUNDARY = re.compile(
    r"[.!?][\"”)]?(?=\s+[A-Z0-9(`*\"“\[_$|])|\n[ \t]*\n|\n(?=[ \t]*(?:[-*+] |\d+[.)] |\|))"
)


@dataclass(frozen=True)
class Citation:
    """One citation: what was written, its sentence, and the place it names (or None)."""

    text: str
    sentence: str
    place: str | None

    @property
    def placed(self) -> bool:
        return self.place is not None


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence of ``text``: cut after ``.``, ``?`` or ``!`` followed
    by space and a capital, a digit or markup (not after ``et al.``, ``e.g.``, ``Fig.`` and
    the other :data:`_ABBREVIATIONS`), at blank lines, and before list items and table rows."""
    spans, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if text[match.start()] == ".":
            word = re.search(r"([A-Za-z.]+)$", text[start : match.start()])
            if word and word.group(1).lower() in _ABBREVIATIONS:
                continue
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def sentence_at(text: str, offset: int, spans: list[tuple[int, int]] | None = None) -> str:
    """The sentence of ``text`` that holds ``offset``, its whitespace collapsed."""
    for start, end in spans if spans is not None else sentence_spans(text):
        if start <= offset < end:
            return " ".join(text[start:end].split())
    return ""


def place_in(sentence: str) -> str | None:
    """The first place (section, table, figure...) that ``sentence`` names, or None."""
    match = PLACE.search(sentence)
    return match.group(0) if match else None


def citations(text: str) -> list[Citation]:
    """Every citation in ``text``, with its sentence and the place that sentence names."""
    spans = sentence_spans(text)
    found = []
    for match in CITATION.finditer(text):
        sentence = sentence_at(text, match.start(), spans)
        found.append(Citation(" ".join(match.group(0).split()), sentence, place_in(sentence)))
    return found


__all__ = [
    "CITATION",
    "PLACE",
    "Citation",
    "citations",
    "place_in",
    "sentence_at",
    "sentence_spans",
]
