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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

_PLACEHOLDER = "DLMATH{}X"
CLOZE = re.compile(r"\{\{c(\d+)::(.*?)(?:::([^{}]*?))?\}\}", re.DOTALL)
_PLACEHOLDER_RE = re.compile(r"DLMATH(\d+)X")


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    # imported here, on first render: loading the deck (and the `distlab` command, which
    # reads card counts through flashcards.model) does not need markdown-it
    from markdown_it import MarkdownIt

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


# -- TeX to plain Unicode, for the terminal ------------------------------------------------
# A small reader of the TeX that cards write in math: commands become Unicode symbols,
# ``x_1`` / ``x^2`` become sub- and superscript characters where Unicode has them all,
# ``\frac{a}{b}`` becomes ``a/b`` (parenthesised where the reading would be ambiguous).
# A command it does not know is left as written (backslash included), so the deck test
# that renders every card (tests/test_flashcards_render.py) names it.
_GREEK_NAMES = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "varsigma", "sigma", "tau", "upsilon",
    "phi", "chi", "psi", "omega",
)  # fmt: skip
_GREEK = {name: chr(0x3B1 + i) for i, name in enumerate(_GREEK_NAMES)}  # α (U+03B1) to ω
_GREEK |= {
    "varepsilon": "ε",
    "vartheta": "ϑ",
    "varphi": "φ",
    "varrho": "ϱ",
    "Gamma": "Γ",
    "Delta": "Δ",
    "Theta": "Θ",
    "Lambda": "Λ",
    "Xi": "Ξ",
    "Pi": "Π",
    "Sigma": "Σ",
    "Upsilon": "Υ",
    "Phi": "Φ",
    "Psi": "Ψ",
    "Omega": "Ω",
}
#: symbols that read as letters of a product: ``\mu s`` is "μs", as TeX sets it
_LETTERS = _GREEK | {"ell": "ℓ", "hbar": "ℏ", "partial": "∂", "nabla": "∇", "infty": "∞"}
#: prefix symbols and opening delimiters, glued to what follows: ``\partial L`` is "∂L"
_PREFIX = {"partial", "nabla", "neg", "lnot", "lVert", "lvert", "lceil", "lfloor", "langle"}
#: relations and binary operators, set with a space on each side
_OPERATORS = {
    "cdot": "·",
    "times": "×",
    "div": "÷",
    "pm": "±",
    "mp": "∓",
    "approx": "≈",
    "sim": "~",
    "simeq": "≃",
    "equiv": "≡",
    "propto": "∝",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "ll": "≪",
    "gg": "≫",
    "lesssim": "≲",
    "gtrsim": "≳",
    "ne": "≠",
    "neq": "≠",
    "in": "∈",
    "notin": "∉",
    "subset": "⊂",
    "subseteq": "⊆",
    "cup": "∪",
    "cap": "∩",
    "to": "→",
    "rightarrow": "→",
    "leftarrow": "←",
    "leftrightarrow": "↔",
    "Rightarrow": "⇒",
    "Leftarrow": "⇐",
    "Leftrightarrow": "⇔",
    "implies": "⇒",
    "iff": "⇔",
    "mapsto": "↦",
    "mid": "|",
    "circ": "∘",
    "oplus": "⊕",
    "otimes": "⊗",
    "bmod": "mod",
    "land": "∧",
    "lor": "∨",
}
#: everything else that is one symbol
_SYMBOLS = {
    "sum": "Σ",
    "prod": "Π",
    "int": "∫",
    "sqrt": "√",
    "neg": "¬",
    "lnot": "¬",
    "top": "⊤",
    "perp": "⊥",
    "forall": "∀",
    "exists": "∃",
    "emptyset": "∅",
    "ldots": "…",
    "dots": "…",
    "cdots": "⋯",
    "vdots": "⋮",
    "lceil": "⌈",
    "rceil": "⌉",
    "lfloor": "⌊",
    "rfloor": "⌋",
    "langle": "⟨",
    "rangle": "⟩",
    "lVert": "‖",
    "rVert": "‖",
    "Vert": "‖",
    "lvert": "|",
    "rvert": "|",
    "vert": "|",
    "ast": "*",
    "star": "⋆",
    "prime": "′",
    "degree": "°",
    "quad": " ",
    "qquad": " ",
}
#: function names, set upright with a space before them after a letter or number
_FUNCTIONS = {
    "log", "ln", "lg", "exp", "sin", "cos", "tan", "min", "max", "arg", "argmin",
    "argmax", "sup", "inf", "lim", "det", "dim", "gcd", "Pr", "deg",
}  # fmt: skip
#: commands whose one argument is shown as plain text
_TEXT_COMMANDS = {
    "text", "textrm", "textit", "textbf", "texttt", "mathrm", "mathit", "mathbf", "mathsf",
    "mathtt", "mathcal", "mathbb", "operatorname", "mbox", "boldsymbol", "bm",
}  # fmt: skip
#: sizing commands that only change how big the next delimiter is
_SIZING = {
    "left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl",
    "biggr", "Biggl", "Biggr", "middle", "displaystyle", "textstyle", "limits", "nolimits",
}  # fmt: skip
_FRACTIONS = {"frac", "tfrac", "dfrac", "cfrac"}
_SPACES = {",": " ", ";": " ", ":": " ", ">": " ", " ": " ", "!": "", "\\": " "}
_ESCAPED = {"%": "%", "{": "{", "}": "}", "_": "_", "&": "&", "#": "#", "$": "$", "|": "‖"}
_SUPERSCRIPT = dict(
    zip(
        "0123456789+-=()abcdefghijklmnoprstuvwxyzABDEGHIJKLMNOPRTUVWαβγδεθιφχ⊤*′",
        "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ᵃᵇᶜᵈᵉᶠᵍʰⁱʲᵏˡᵐⁿᵒᵖʳˢᵗᵘᵛʷˣʸᶻᴬᴮᴰᴱᴳᴴᴵᴶᴷᴸᴹᴺᴼᴾᴿᵀᵁⱽᵂᵅᵝᵞᵟᵋᶿᶥᵠᵡᵀ*′",
        strict=True,
    )
)
_SUBSCRIPT = dict(
    zip(
        "0123456789+-=()aehijklmnoprstuvxβγρφχ",
        "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓᵦᵧᵨᵩᵪ",
        strict=True,
    )
)
_FRACTION_END = "\x00"  # marks where a fraction ends, until we know what follows it


class _TexReader:
    """Reads one formula left to right; :meth:`expression` returns its plain-text reading."""

    def __init__(self, tex: str) -> None:
        self.tex = tex
        self.i = 0

    def expression(self, stop: str = "") -> str:
        out: list[str] = []
        while self.i < len(self.tex) and self.tex[self.i] not in stop:
            out.append(self.atom(out))
        return "".join(out)

    def atom(self, before: list[str]) -> str:
        """The reading of the next piece; ``before`` is what was read so far (for spacing)."""
        tex, i = self.tex, self.i
        ch = tex[i]
        self.i += 1
        if ch == "{":
            inner = self.expression("}")
            self.i += 1  # the closing brace (or the end of an unbalanced formula)
            return inner
        if ch in "^_":
            return _script(self.argument(), superscript=ch == "^")
        if ch == "~":
            return " "
        if ch != "\\":
            return ch
        if self.i >= len(tex):
            return "\\"
        if not tex[self.i].isalpha():
            symbol = tex[self.i]
            self.i += 1
            return _SPACES.get(symbol, _ESCAPED.get(symbol, "\\" + symbol))
        name = re.match(r"[A-Za-z]+", tex[self.i :]).group(0)
        self.i += len(name)
        return self.command(name, before)

    def command(self, name: str, before: list[str]) -> str:
        if name in _FRACTIONS:
            numerator, denominator = self.argument(), self.argument()
            return f"{_group(numerator, loose=True)}/{_group(denominator)}{_FRACTION_END}"
        if name == "sqrt":
            index = self.optional()
            root = {"": "√", "3": "∛", "4": "∜"}.get(index, f"{_script(index, True)}√")
            return root + _group(self.argument())
        if name in _TEXT_COMMANDS:
            return self.argument()
        if name in _SIZING:
            if name not in ("displaystyle", "textstyle", "limits", "nolimits"):
                self.skip_spaces()
                if self.tex.startswith(".", self.i):  # \left. : no delimiter
                    self.i += 1
            return ""
        if name in _OPERATORS:
            return f" {_OPERATORS[name]} "
        if name in _FUNCTIONS:
            glue = " " if before and before[-1][-1:].isalnum() else ""
            return glue + name
        if name in _PREFIX:
            self.skip_spaces()
        elif name in _LETTERS and re.match(r"\s+[A-Za-z0-9]", self.tex[self.i :]):
            self.skip_spaces()  # \mu s -> "μs": TeX ignores a space after a command
        if name in _LETTERS:
            return _LETTERS[name]
        if name in _SYMBOLS:
            return _SYMBOLS[name]
        return "\\" + name  # unknown: left visible, and the deck test names it

    def argument(self) -> str:
        """One argument: a ``{group}``, a command, or a single character."""
        self.skip_spaces()
        if self.i >= len(self.tex):
            return ""
        if self.tex[self.i] == "{":
            return self.atom([])
        return self.atom([]).strip()

    def optional(self) -> str:
        """An optional ``[...]`` argument, or ``""``."""
        if not self.tex.startswith("[", self.i):
            return ""
        self.i += 1
        inner = self.expression("]")
        self.i += 1
        return inner

    def skip_spaces(self) -> None:
        while self.i < len(self.tex) and self.tex[self.i].isspace():
            self.i += 1


def _is_atom(text: str, *, loose: bool = False) -> bool:
    """True when ``text`` needs no parentheses around it in ``a/b`` or ``√x``.

    A single symbol or number always; with ``loose`` (a numerator), any run of letters and
    digits, since ``2N/n`` reads as ``(2N)/n`` anyway."""
    text = text.replace(_FRACTION_END, "")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return True
    if loose:
        return bool(text) and all(ch.isalnum() or ch in ".∂∇′" for ch in text)
    scripts = set(_SUPERSCRIPT.values()) | set(_SUBSCRIPT.values())
    return len([ch for ch in text.lstrip("∂∇") if ch not in scripts]) == 1


def _group(text: str, *, loose: bool = False) -> str:
    text = " ".join(text.split())
    return text if _is_atom(text, loose=loose) else f"({text})"


def _script(text: str, superscript: bool) -> str:
    """``text`` as Unicode super/subscript characters, or ``^x`` / ``_(text)`` where
    Unicode lacks one of them."""
    text = "".join(text.replace(_FRACTION_END, "").split())
    table = _SUPERSCRIPT if superscript else _SUBSCRIPT
    if text and all(ch in table for ch in text):
        return "".join(table[ch] for ch in text)
    mark = "^" if superscript else "_"
    return f"{mark}{text}" if len(text) == 1 else f"{mark}({text})"


def tex_to_text(tex: str) -> str:
    """A plain-Unicode reading of card TeX for the terminal.

    ``2\\frac{n-1}{n}N\\beta`` -> ``2(n-1)/n · Nβ``, ``A = [A_1 \\mid A_2]`` ->
    ``A = [A₁ | A₂]``, ``2^{-10} \\approx 9.8\\times10^{-4}`` -> ``2⁻¹⁰ ≈ 9.8 × 10⁻⁴``.
    """
    text = _TexReader(tex).expression()
    # a fraction followed directly by a factor: "(n-1)/n · N", never "(n-1)/nN"
    text = re.sub(_FRACTION_END + r"(?=[\w(\[√∂∇⌈⌊‖|])", " · ", text)
    text = text.replace(_FRACTION_END, "")
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"([(\[]) | ([)\]])", r"\1\2", text)
    return text.strip()


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
