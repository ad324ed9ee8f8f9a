"""Markdown + math rendering for the widget, Anki and the terminal."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from rich.panel import Panel

from flashcards.cli import card_markdown
from flashcards.model import load_deck
from flashcards.render import (
    cloze_back,
    cloze_front,
    cloze_inside_math,
    cloze_numbers,
    split_math,
    tex_to_text,
    to_html,
    to_terminal,
)


def test_inline_and_display_math_get_mathjax_delimiters():
    html = to_html("Each rank sends $2(n-1)/n \\cdot N$ bytes:\n\n$$T = 2(n-1)\\alpha$$")
    assert "\\(2(n-1)/n \\cdot N\\)" in html
    assert "\\[T = 2(n-1)\\alpha\\]" in html
    assert "$" not in html


def test_markdown_does_not_touch_math_and_math_is_html_escaped():
    html = to_html("**bold** and $a_i * b_j < c_k$ and *em*")
    assert "<strong>bold</strong>" in html and "<em>em</em>" in html
    assert "\\(a_i * b_j &lt; c_k\\)" in html  # no <em> inside the math, < escaped


def test_dollars_that_are_not_math():
    assert split_math("costs $5 and $10 today") == [("text", "costs $5 and $10 today")]
    assert to_html("a literal \\$3") == "<p>a literal $3</p>"
    assert "<code>$x$</code>" in to_html("code `$x$` stays")
    fenced = to_html("```\ny = $x$\n```\nafter $z$")
    assert "y = $x$" in fenced and "\\(z\\)" in fenced


def test_raw_html_in_cards_is_escaped():
    assert "&lt;script&gt;" in to_html("<script>alert(1)</script>")


@pytest.mark.parametrize(
    ("tex", "text"),
    [
        (r"A = [A_1 \mid A_2]", "A = [A₁ | A₂]"),  # issue 27: this reached the terminal as TeX
        (r"\frac{n-1}{n} \cdot N \approx \sqrt{2}", "(n-1)/n · N ≈ √2"),
        (r"2\frac{n-1}{n}N\beta", "2(n-1)/n · Nβ"),  # never "(n-1)/(n)N"
        (r"\frac{s}{6h} \le \frac1K", "s/(6h) ≤ 1/K"),
        (r"\tau \approx \sqrt{2\,C\,M}", "τ ≈ √(2 C M)"),
        (r"2^{-10} \approx 9.8\times10^{-4}", "2⁻¹⁰ ≈ 9.8 × 10⁻⁴"),
        (r"\delta_{i-1} = W_i^\top \delta_i", "δᵢ₋₁ = Wᵢᵀ δᵢ"),
        (r"\dfrac{\partial L}{\partial W_1}", "∂L/∂W₁"),
        (r"2\lceil\log_2 n\rceil", "2⌈log₂ n⌉"),
        (r"L = \tfrac12\lVert h_3 - y\rVert^2", "L = 1/2 · ‖h₃ - y‖²"),
        (r"\left(1 + \frac{V}{16 l h}\right)", "(1 + V/(16 l h))"),
        (r"\mathrm{GeLU}(XA) \ne \text{out}_{os+g}", "GeLU(XA) ≠ out_(os+g)"),
        (r"\alpha = 2\,\mu s,\ 25\%", "α = 2 μs, 25%"),
    ],
)
def test_terminal_rendering_reads_tex_as_unicode(tex, text):
    assert tex_to_text(tex) == text


def test_an_unknown_command_stays_visible():
    # so that test_no_card_shows_tex_in_the_terminal names it, rather than a silent guess
    assert tex_to_text(r"x \frobnicate y") == r"x \frobnicate y"


def test_terminal_math_is_a_code_span():
    assert to_terminal("send $2\\frac{n-1}{n}N$") == "send `2(n-1)/n · N`"


def _terminal(text: str) -> str:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(Panel(card_markdown(text)))
    return console.file.getvalue()


def test_no_card_shows_tex_in_the_terminal():
    """Every side of every card of the course deck, as the terminal drill prints it: no
    ``\\command``, no ``\\,`` and no ``$`` delimiter is left (issue 27)."""
    leftovers = {}
    for card in load_deck():
        for side in (card.q, card.a):
            found = re.findall(r"\\(?:[A-Za-z]+|[^A-Za-z\s])|\$", _terminal(side))
            if found:
                leftovers.setdefault(card.slug, set()).update(found)
    assert not leftovers, "TeX left in the terminal drill:\n" + "\n".join(
        f"{slug}: {sorted(found)}" for slug, found in leftovers.items()
    )
    assert "W = [W₁ | W₂]" in _terminal(load_deck().by_slug("tp-column-parallel").a)


def test_cloze_front_hides_one_deletion_and_back_shows_it():
    text = "Adam keeps {{c1::16}} bytes: {{c2::12::how many?}} of them optimizer state."
    assert cloze_numbers(text) == [1, 2]
    assert cloze_front(text, 1) == "Adam keeps [...] bytes: 12 of them optimizer state."
    assert cloze_front(text, 2) == "Adam keeps 16 bytes: [how many?] of them optimizer state."
    assert cloze_back(text, 2) == "Adam keeps 16 bytes: **12** of them optimizer state."
    assert "<strong>12</strong>" in to_html(cloze_back(text, 2))
    formula = "Ring: {{c1::$2(n-1)\\alpha$}}"
    assert to_terminal(cloze_back(formula, 1)) == "Ring: **`2(n-1)α`**"
    assert cloze_inside_math(formula) is None
    assert cloze_inside_math("$T = {{c1::2(n-1)}}\\alpha$") == "{{c1::2(n-1)}}"
