"""Can a person read this figure? Checks made on the figure as it is drawn.

:func:`problems` lays a figure out and draws it once (as a notebook does: at its dpi,
cropped to what is drawn, though without making the pixels) and records every text that
was really drawn (tick labels, axis labels, titles, legend entries, annotations, labels
inside boxes), with its extent in pixels. It reports

* **small text**: a font under :data:`~distlab.viz.style.MIN_FONT_PT` points once the figure
  is shrunk to fit a notebook's output area (:data:`~distlab.viz.style.NOTEBOOK_WIDTH_IN`);
* **overlapping text**: two texts whose extents cross (``chunk 0chunk 1``);
* **text on a hatch**: a text drawn over a hatched patch, whose lines run through the glyphs.

:func:`assert_legible` raises :class:`AssertionError` listing them, with the figure's name;
``tests/test_figure_legibility.py`` runs it on every figure a notebook draws. A notebook
author can run it on a new figure the same way.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from distlab.viz.style import MIN_FONT_PT, NOTEBOOK_WIDTH_IN

OVERLAP_PX = 1.0  # extents may touch by this much (anti-aliasing), not more


@dataclass(frozen=True)
class DrawnText:
    """A text the last draw rendered: its string, font size (points) and extent (pixels)."""

    text: str
    size_pt: float
    extent: Bbox

    def __str__(self) -> str:
        e = self.extent
        where = f"x={e.x0:.0f}-{e.x1:.0f}, y={e.y0:.0f}-{e.y1:.0f} px"
        return f"{self.text!r} ({self.size_pt:g} pt at {where})"


@contextmanager
def _recording(into: list[Text]):
    """Record every :class:`Text` whose ``draw`` runs (subclasses and annotations included)."""
    draw = Text.draw

    def recorded(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            into.append(self)

    Text.draw = recorded
    try:
        yield
    finally:
        Text.draw = draw


def drawn_texts(fig: Figure) -> tuple[list[DrawnText], list[Bbox], float]:
    """Lay ``fig`` out and draw it once (without making pixels: the extents are the same);
    return the texts drawn, the extents of its hatched patches, and the shrink factor a
    notebook applies (1 when the cropped figure fits its output area)."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    texts: list[Text] = []
    with _recording(texts):
        fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    width_in = fig.get_tightbbox(renderer).width  # what bbox_inches="tight" keeps, unpadded
    shrink = min(1.0, NOTEBOOK_WIDTH_IN / width_in)
    drawn = [
        DrawnText(t.get_text(), t.get_fontsize(), t.get_window_extent(renderer)) for t in texts
    ]
    hatched = [
        p.get_window_extent(renderer)
        for p in fig.findobj(Patch)
        if p.get_visible() and p.get_hatch() and p.axes is not None
    ]
    return drawn, hatched, shrink


def _crossings(boxes: list[Bbox], others: list[Bbox]) -> np.ndarray:
    """``[i, j]`` is True where ``boxes[i]`` and ``others[j]`` overlap by more than
    :data:`OVERLAP_PX` both ways."""
    a = np.array([b.extents for b in boxes]).reshape(-1, 1, 4)
    b = np.array([o.extents for o in others]).reshape(1, -1, 4)
    dx = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    dy = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    return (dx > OVERLAP_PX) & (dy > OVERLAP_PX)


def problems(fig: Figure, *, min_pt: float = MIN_FONT_PT) -> list[str]:
    """Every legibility problem of ``fig`` as drawn, one line each; empty when there is none."""
    texts, hatched, shrink = drawn_texts(fig)
    found = []
    if shrink < 1:
        found.append(
            f"the figure is wider than a notebook's output area ({NOTEBOOK_WIDTH_IN:g} in): it is "
            f"shown at {shrink:.0%}, its text with it"
        )
    for t in texts:
        if t.size_pt * shrink < min_pt - 1e-9:
            shown = f" (shown at {t.size_pt * shrink:.1f} pt)" if shrink < 1 else ""
            found.append(f"text under {min_pt:g} pt: {t}{shown}")
    extents = [t.extent for t in texts]
    if texts:
        for i, j in zip(*np.nonzero(np.triu(_crossings(extents, extents), k=1))):
            found.append(f"texts overlap: {texts[i]} and {texts[j]}")
    if texts and hatched:
        for i in np.nonzero(_crossings(extents, hatched).any(axis=1))[0]:
            found.append(f"text drawn on a hatched patch: {texts[i]}")
    return found


def assert_legible(fig: Figure, name: str, *, min_pt: float = MIN_FONT_PT, shown: int = 4) -> None:
    """Raise :class:`AssertionError` naming ``name`` and, for each kind of problem it has
    (small text, overlapping texts, text on a hatch), how many and the first ``shown``."""
    found = problems(fig, min_pt=min_pt)
    if not found:
        return
    kinds: dict[str, list[str]] = {}
    for line in found:
        kinds.setdefault(line.split(":")[0], []).append(line)
    report = []
    for lines in kinds.values():
        more = [f"... and {len(lines) - shown} more like it"] if len(lines) > shown else []
        report += lines[:shown] + more
    listed = "\n  ".join(report)
    raise AssertionError(f"figure {name!r} is hard to read ({len(found)} problems):\n  {listed}")
