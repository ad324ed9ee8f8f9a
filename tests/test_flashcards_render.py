"""Markdown + math rendering for the widget, Anki and the terminal."""

from __future__ import annotations

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


def test_terminal_rendering_reads_simple_tex():
    assert tex_to_text(r"\frac{n-1}{n} \cdot N \approx \sqrt{2}") == "(n-1)/(n) · N ≈ √(2)"
    assert to_terminal("send $2\\frac{n-1}{n}N$") == "send `2(n-1)/(n)N`"


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
