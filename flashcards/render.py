"""Card text (Markdown with ``$...$`` / ``$$...$$`` math) to HTML.

Markdown is rendered by markdown-it-py (CommonMark + tables; raw HTML is escaped). Math
is cut out before Markdown sees it, so ``a_i * b_j`` inside math is never read as
emphasis, and put back HTML-escaped between the delimiters the target expects:
``\\(...\\)`` and ``\\[...\\]`` (Anki's MathJax and JupyterLab's both read them).

Which ``$`` open math follows Pandoc's ``tex_math_dollars`` rule: the opening ``$`` has a
non-space character right after it, the closing ``$`` a non-space character right before
it and no digit right after it, so "$5 and $10" stays text. ``\\$`` is a literal dollar.

Cloze cards use Anki's syntax, ``{{c1::answer}}`` or ``{{c1::answer::hint}}``: the card for
deletion ``n`` shows every other deletion's answer, hides deletion ``n`` as ``[...]`` (or
``[hint]``) on the front and shows it in bold on the back (:func:`cloze_front`,
:func:`cloze_back`). A deletion wraps whole formulas (``{{c1::$2(n-1)$}}``), never part of one.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache

from markdown_it import MarkdownIt

_PLACEHOLDER = "DLMATH{}X"
CLOZE = re.compile(r"\{\{c(\d+)::(.*?)(?:::([^{}]*?))?\}\}", re.DOTALL)
_PLACEHOLDER_RE = re.compile(r"DLMATH(\d+)X")


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def split_math(text: str) -> list[tuple[str, str]]:
    """Split text into ``("text" | "inline" | "display", content)`` pieces.

    Code spans and fenced code blocks are left alone (a ``$`` in code is not math).
    """
    pieces: list[tuple[str, str]] = []
    buf: list[str] = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        if at_line_start and text.startswith("```", i):
            close = text.find("\n```", i + 3)
            eol = -1 if close == -1 else text.find("\n", close + 4)
            end = n if eol == -1 else eol
            buf.append(text[i:end])
            i = end
            continue
        ch = text[i]
        at_line_start = ch == "\n"
        if ch == "\\" and i + 1 < n and text[i + 1] == "$":
            buf.append("\\$")
            i += 2
        elif ch == "`":
            ticks = len(text[i:]) - len(text[i:].lstrip("`"))
            close = text.find("`" * ticks, i + ticks)
            end = n if close == -1 else close + ticks
            buf.append(text[i:end])
            i = end
        elif text.startswith("$$", i):
            close = text.find("$$", i + 2)
            if close == -1:
                buf.append("$$")
                i += 2
                continue
            _flush(buf, pieces)
            pieces.append(("display", text[i + 2 : close].strip()))
            i = close + 2
        elif ch == "$" and i + 1 < n and not text[i + 1].isspace():
            close = _closing_dollar(text, i + 1)
            if close is None:
                buf.append("$")
                i += 1
                continue
            _flush(buf, pieces)
            pieces.append(("inline", text[i + 1 : close]))
            i = close + 1
        else:
            buf.append(ch)
            i += 1
    _flush(buf, pieces)
    return pieces


def _closing_dollar(text: str, start: int) -> int | None:
    limit = len(text)  # inline math never spans a paragraph break or a code span
    for stop in ("\n\n", "`"):
        found = text.find(stop, start)
        limit = limit if found == -1 else min(limit, found)
    j = start
    while True:
        j = text.find("$", j, limit)
        if j == -1:
            return None
        escaped = text[j - 1] == "\\"
        after_digit = j + 1 < len(text) and text[j + 1].isdigit()
        if j > start and not escaped and not text[j - 1].isspace() and not after_digit:
            return j
        j += 1


def _flush(buf: list[str], pieces: list[tuple[str, str]]) -> None:
    if buf:
        pieces.append(("text", "".join(buf)))
        buf.clear()


def to_html(text: str) -> str:
    """Render card Markdown to HTML with math in ``\\(...\\)`` / ``\\[...\\]``."""
    parts, maths = [], []
    for kind, content in split_math(text):
        if kind == "text":
            parts.append(content)
        else:
            parts.append(_PLACEHOLDER.format(len(maths)))
            maths.append((kind, content))
    rendered = _markdown().render("".join(parts)).strip()

    def restore(match: re.Match) -> str:
        kind, tex = maths[int(match.group(1))]
        tex = html.escape(tex, quote=False)
        return f"\\({tex}\\)" if kind == "inline" else f"\\[{tex}\\]"

    return _PLACEHOLDER_RE.sub(restore, rendered)


_TEX_SYMBOLS = {
    r"\cdot": "·",
    r"\times": "×",
    r"\approx": "≈",
    r"\leq": "≤",
    r"\geq": "≥",
    r"\le": "≤",
    r"\ge": "≥",
    r"\neq": "≠",
    r"\to": "→",
    r"\rightarrow": "→",
    r"\leftrightarrow": "↔",
    r"\infty": "∞",
    r"\sum": "Σ",
    r"\Psi": "Ψ",
    r"\alpha": "α",
    r"\beta": "β",
    r"\gamma": "γ",
    r"\lceil": "⌈",
    r"\rceil": "⌉",
    r"\lfloor": "⌊",
    r"\rfloor": "⌋",
    r"\,": " ",
    r"\;": " ",
}
_TEX_COMMAND = re.compile(r"\\[A-Za-z]+|\\[,;]")
_TEX_FRAC = re.compile(r"\\frac\{([^{}]*)\}\{([^{}]*)\}")
_TEX_SQRT = re.compile(r"\\sqrt\{([^{}]*)\}")
_TEX_TEXT = re.compile(r"\\(?:text|mathrm|operatorname|mathbf)\{([^{}]*)\}")


def tex_to_text(tex: str) -> str:
    """Plain-text reading of simple TeX for the terminal (``\\frac{a}{b}`` -> ``(a)/(b)``)."""
    tex = _TEX_TEXT.sub(r"\1", tex)
    tex = _TEX_FRAC.sub(r"(\1)/(\2)", tex)
    tex = _TEX_SQRT.sub(r"√(\1)", tex)
    return _TEX_COMMAND.sub(lambda m: _TEX_SYMBOLS.get(m.group(0), m.group(0)), tex)


def to_terminal(text: str) -> str:
    """Markdown for rich's terminal renderer: math as code spans in plain-text TeX."""
    out = []
    for kind, content in split_math(text):
        if kind == "text":
            out.append(content)
        elif kind == "inline":
            out.append(f"`{tex_to_text(content)}`")
        else:
            out.append(f"\n\n    {tex_to_text(content)}\n\n")
    return "".join(out)


def cloze_numbers(text: str) -> list[int]:
    """The deletion numbers of a cloze text, sorted: ``[1, 2]`` for ``{{c1::a}} {{c2::b}}``."""
    return sorted({int(m.group(1)) for m in CLOZE.finditer(text)})


def cloze_front(text: str, number: int) -> str:
    """The question side of deletion ``number``: it becomes ``[...]`` (or ``[hint]``)."""
    return CLOZE.sub(
        lambda m: f"[{m.group(3) or '...'}]" if int(m.group(1)) == number else m.group(2), text
    )


def cloze_back(text: str, number: int) -> str:
    """The answer side of deletion ``number``: its answer in bold, the rest as written."""
    return CLOZE.sub(
        lambda m: f"**{m.group(2)}**" if int(m.group(1)) == number else m.group(2), text
    )


def cloze_inside_math(text: str) -> str | None:
    """The first deletion that starts or ends inside a formula (``$x = {{c1::2}}$``), else None;
    such a deletion would break the formula when hidden or set in bold."""
    found: list[str] = []

    def mark(match: re.Match) -> str:
        found.append(match.group(0))
        tag = f"DLCLOZE{len(found) - 1}X"
        return f"{tag}{match.group(2)}{tag}"

    for kind, content in split_math(CLOZE.sub(mark, text)):
        hit = re.search(r"DLCLOZE(\d+)X", content) if kind != "text" else None
        if hit:
            return found[int(hit.group(1))]
    return None
