"""What every distlab figure shares: the width a notebook shows, the smallest text, log axes.

A notebook shows a figure as a PNG at the figure's dpi (matplotlib's default, 100, since
the inline backend no longer changes it), cropped to what is drawn (``bbox_inches="tight"``).
An output area at 100 % zoom is about :data:`NOTEBOOK_WIDTH_IN` inches of that PNG wide
(1,000 px, plus the crop's white margin: Jupyter's classic output area, nbviewer); a wider
PNG is shrunk to fit, and its text with it. So a figure is planned to be at most that wide,
with no text under :data:`MIN_FONT_PT` points. :mod:`distlab.viz.legibility` checks both.

:func:`log_scale` makes an axis logarithmic with plain numbers as tick labels (``20``,
``0.003``, ``1,000``) instead of matplotlib's ``2×10^1`` on minor ticks.
"""

from __future__ import annotations

import math

from matplotlib.ticker import LogFormatter

NOTEBOOK_DPI = 100  # matplotlib's default figure dpi: what the inline PNG uses
NOTEBOOK_WIDTH_IN = 10.0  # what an output area shows at 100 % zoom without shrinking
MIN_FONT_PT = 7.0  # no smaller text, at NOTEBOOK_DPI and after any shrinking

PLAIN_RANGE = (1e-3, 1e5)  # an axis within this range is labelled in plain numbers


def plain_number(x: float) -> str:
    """``20``, ``0.003``, ``1,000``: one significant digit is all a log tick has (the
    locator puts ticks at k x 10^n, k an integer)."""
    decimals = max(0, -math.floor(math.log10(x) + 1e-9)) if x > 0 else 0
    return f"{x:,.{decimals}f}"


class PlainLogFormatter(LogFormatter):
    """matplotlib's :class:`~matplotlib.ticker.LogFormatter`, which decides which ticks carry
    a label (minor ones only when the axis spans about a decade or less), writing them as
    plain numbers (``20``, ``0.003``) when the whole axis lies in :data:`PLAIN_RANGE`.
    Beyond it a power of the base reads ``10^n`` and any other tick ``2e-5``, never
    ``2×10^-5``."""

    def _num_to_string(self, x, vmin, vmax):  # the hook LogFormatter's subclasses override
        if PLAIN_RANGE[0] <= min(vmin, vmax) and max(vmin, vmax) <= PLAIN_RANGE[1]:
            return plain_number(x)
        exponent = math.log(x, self._base)
        if abs(exponent - round(exponent)) < 1e-9:
            return rf"$\mathdefault{{{self._base:g}^{{{round(exponent)}}}}}$"
        mantissa, power = f"{x:.0e}".split("e")
        return f"{mantissa}e{int(power)}"


def log_scale(ax, which: str = "both", base: float = 10) -> None:
    """Make the ``which`` axis of ``ax`` (``"x"``, ``"y"`` or ``"both"``) logarithmic in
    ``base``, with plain numbers on its major and minor ticks (:class:`PlainLogFormatter`)."""
    if which not in ("x", "y", "both"):
        raise ValueError(f"which must be 'x', 'y' or 'both', got {which!r}")
    for name in ("x", "y") if which == "both" else (which,):
        getattr(ax, f"set_{name}scale")("log", base=base)
        axis = getattr(ax, f"{name}axis")
        axis.set_major_formatter(PlainLogFormatter(base))
        axis.set_minor_formatter(PlainLogFormatter(base))
