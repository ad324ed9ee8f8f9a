"""The numbers a notebook's markdown states: what counts as one, and how one reads.

:func:`stated_numbers` finds them in one markdown cell's source, for
:mod:`distlab.site.stated_numbers`, which says what checks each. A stated number is a numeral
in prose: ``1,440``, ``5.5``, ``9.8e-4``, ``7B``, ``4x``, ``15.8 %``. These rules, which err
on the side of counting, leave out what is not a quantity:

* code (fenced blocks and inline code spans), except a numeral, a space and a unit inside a
  span (a span ``16Ψ = 208 GB`` states a formula's result); math (``$...$``); HTML tags, URLs, link
  targets; headings; quotations (``"..."``: what someone else wrote, which the course quotes
  to correct it or to name its source);
* names and versions: a numeral glued to letters before it (``H100``, ``fp32``, ``x16``) or
  after it when they are not a unit (``1F1B``, ``3D``, ``2nd``), joined by a hyphen to a word
  before it (``ZeRO-1``, ``GPT-3``), a bit width (``16-bit``), after a versioned name
  (``Llama 3``, ``PCIe 4.0``: :data:`VERSIONED`), or the size in a model's name
  (``LLaMA-2 70B``, ``Llama 3 405B``);
* numbering: after ``notebook``, ``exercise``, ``problem``, ``section``, ``§``, ``figure``,
  ``table``, ``stage``, ``rank``, ``layer``... (:data:`NUMBERING`) and the numerals listed
  after them (``notebooks 04 and 06``, ``layers 1-2 and 9-10``); list markers (``1.``
  opening a line); a journal's volume (``CACM 31(5)``);
* years (1950-2035, written without a separator or unit) and arXiv identifiers;
* powers written as such (``10⁹``, ``2^30``): a unit's definition;
* small counts: a whole number below 10 with no unit after it (``2 processes``, ``8 GPUs``).

A unit (:data:`UNITS`) is a size, a time, a rate, ``%``, ``x``/``×``/``times`` or a scale
(``K``, ``M``, ``B``, ``billion``); a whole number below 10 with a unit (``2 bytes``, ``4x``)
counts. A stated number *reads as* another number when that one, rounded to the digits stated,
is it (:meth:`Stated.reads_as`: "1.5" reads 1.46, "18,500" reads 18,456).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from distlab.site.citations import sentence_at, sentence_spans


def _words(*lines: str) -> frozenset[str]:
    return frozenset(" ".join(lines).split())


#: what a unit after a numeral may be (glued, or after one space)
UNITS = _words(
    "% x × times percent K k M B T billion million thousand trillion b bit bits byte ",
    "bytes KB kB MB GB TB PB KiB MiB GiB TiB PiB Kb Mb Gb Tb s ms µs μs us ns sec min ",
    "minutes hours hour days day weeks FLOP FLOPs FLOP/s GFLOP/s TFLOP/s PFLOP/s EFLOP/s ",
    "MFLOPs GFLOPs TFLOPs PFLOPs EFLOPs",
    "TFLOPS PFLOPS GB/s TB/s MB/s Gb/s Gbit/s Gbps W kW MW GHz MHz px",
)
#: a word before a numeral that makes it a label (``notebook 04``), not a quantity
NUMBERING = _words(
    "notebook notebooks exercise exercises problem problems question questions section ",
    "sections § §§ sec. figure figures fig. figs. table tables tab. eq. eqs. equation ",
    "equations appendix chapter chapters part parts step steps stage stages rank ranks ",
    "layer layers chunk chunks case cases cell cells line lines page pages p. pp. item ",
    "items phase phases row rows column columns epoch algorithm listing version ",
    "micro-batch priority",
)
#: names followed by a version number (``Llama 3``, ``PCIe 4.0``)
VERSIONED = _words(
    "Llama LLaMA PCIe NVLink NVSwitch Python PyTorch CUDA NCCL Gen HBM Ubuntu Debian ",
    "Gemma Mistral Qwen Mixtral GPT Blackwell Hopper MLPerf",
)

_MASKS = [
    re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE),  # fenced code
    re.compile(r"^#{1,6} .*$", re.MULTILINE),  # headings
    re.compile(r"\$\$.*?\$\$", re.DOTALL),  # display math
    re.compile(r"\$[^$\n]+\$"),  # inline math
    re.compile(r"<[^>\n]+>"),  # HTML tags
    re.compile(r"https?://\S+"),  # URLs
    re.compile(r"(?<=\])\([^)\s]*\)"),  # link targets
    re.compile(r"(?<![\w`])\"[^\"\n]+(?:\n[^\"\n]+)*\"|“[^”\n]+(?:\n[^”\n]+)*”"),  # quotations
]
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_NUMERAL = re.compile(
    r"(?<![\w.,^])(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?"
    r"(?P<exp>[eE][-+]?\d+)?(?P<glued>[A-Za-zµμ%×]+(?:/s)?)?"
)
_AFTER = re.compile(r"[ \u00a0\u202f]?(?P<unit>[A-Za-zµμ%×]+(?:/s)?)")
#: a model family and version right before a size: ``Llama 3 405B``, ``LLaMA-2 70B``, ``GPT-3 175B``
_MODEL = re.compile(r"\b(?:Llama|LLaMA|GPT|Mixtral|Qwen|Gemma|Mistral)[- ]?\d+(?:\.\d+)?[ \u00a0]$")
_JOINER = re.compile(r"\s*(?:,|,? and|,? or|&|-|–|to)\s*")
_SCALES = [1000.0**k for k in range(-4, 5)]


@dataclass(frozen=True)
class Stated:
    """One number stated in a markdown cell: where, as written, and its sentence."""

    notebook: str
    cell: str  # the cell's id
    text: str  # the numeral as written, "1,440"
    value: float
    tolerance: float  # half a unit of the last digit stated
    start: int  # offsets in the cell's source
    end: int
    sentence: str
    unit: str = ""  # the unit written after it, if any

    @property
    def distinctive(self) -> bool:
        """Three significant digits or more (``65504``, ``61.75``, ``1,440``), and not a power
        of two: too specific to be printed by chance, where ``16``, ``1.5``, ``120`` or
        ``4,096`` could be."""
        mantissa = re.split("[eE]", self.text)[0].replace(",", "")
        digits = mantissa.replace(".", "").strip("0") if "." in mantissa else mantissa.strip("0")
        power_of_two = (
            self.value >= 1
            and self.value.is_integer()
            and not int(self.value) & (int(self.value) - 1)
        )
        return len(digits) >= 3 and not power_of_two

    def reads_as(self, number: float) -> bool:
        """Whether ``number``, rounded to the digits this numeral states, is this numeral."""
        return abs(abs(number) - self.value) <= self.tolerance * (1 + 1e-9)

    def reads_as_scaled(self, number: float) -> bool:
        """:meth:`reads_as`, and up to a unit prefix (a power of 1,000) for a quantity with a
        unit, or a factor 100 for a percentage."""
        if self.unit in ("%", "percent"):
            return self.reads_as(number) or self.reads_as(100 * number)
        if not self.unit or self.unit in ("x", "×", "times"):
            return self.reads_as(number)
        return any(self.reads_as(number * scale) for scale in _SCALES)


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def _masked(source: str) -> str:
    """``source`` with code, math, markup, headings and quotations blanked out (same length,
    newlines kept); a numeral, a space and a unit inside a code span stay."""
    source = _MASKS[0].sub(_blank, source)

    def code_span(match: re.Match) -> str:
        span = match.group(0)
        keep = [m.span() for m in _NUMERAL.finditer(span) if _spaced_unit(span, m)]
        return "".join(c if any(a <= i < b for a, b in keep) else " " for i, c in enumerate(span))

    source = _CODE_SPAN.sub(code_span, source)
    for pattern in _MASKS[1:]:
        source = pattern.sub(_blank, source)
    return source


def _unit(text: str, m: re.Match) -> str | None:
    """The unit written right after numeral ``m``, glued or after one space, or None."""
    if m.group("glued"):
        return m.group("glued") if m.group("glued") in UNITS else None
    after = _AFTER.match(text, m.end())
    return after.group("unit") if after and after.group("unit") in UNITS else None


def _spaced_unit(span: str, m: re.Match) -> bool:
    """Inside a code span a quantity is a numeral, a space and a unit of two letters or more,
    or ``%`` (``= 208 GB``); ``4h`` or ``7B`` there is code."""
    after = _AFTER.match(span, m.end())
    if m.group("glued") or not after or span[m.end()] != " ":
        return False
    unit = after.group("unit")
    return unit in UNITS and (len(unit) > 1 or unit == "%")


def _word_before(text: str, start: int) -> str:
    word = re.search(r"([A-Za-z§][\w.§-]*)[ \t(]*$", text[max(0, start - 40) : start])
    return word.group(1) if word else ""


def _why_not_stated(text: str, m: re.Match, previous: tuple[int, str | None]) -> str | None:
    """Why numeral ``m`` of the masked ``text`` is not a stated number, or None if it is."""
    start, end, glued = m.start(), m.end(), m.group("glued") or ""
    word = _word_before(text, start)
    unit = _unit(text, m)
    if re.match(r"[A-Za-z]-$", text[max(0, start - 2) : start]) or (glued and not unit):
        return "name"  # ZeRO-1, GPT-3; 1F1B, 3D, 2nd
    if re.match(r"-bits?\b", text[end : end + 5]):
        return "name"  # 16-bit
    if text[end : end + 1] and text[end] in "⁰¹²³⁴⁵⁶⁷⁸⁹^":
        return "power"  # 10⁹, 2^30
    if word in VERSIONED:
        return "version"
    if glued in ("B", "M", "T") and _MODEL.search(text[max(0, start - 20) : start]):
        return "name"  # the size in a model's name: Llama 3 405B
    if word.lower() in NUMBERING or (
        previous[1] == "numbering" and _JOINER.fullmatch(text[previous[0] : start])
    ):
        return "numbering"
    if re.match(r"\(\d+\)", text[end : end + 4]):
        return "numbering"  # a journal's volume(issue)
    line_start = text.rfind("\n", 0, start) + 1
    if re.fullmatch(r"[ \t]*(?:[-*+] )?", text[line_start:start]) and re.match(
        r"[.)][ \t]", text[end : end + 2]
    ):
        return "list marker"
    digits, whole = m.group("int"), not m.group("frac") and not m.group("exp")
    if len(digits) == 4 and len(m.group("frac") or "") in (5, 6):
        return "arXiv id"  # 2104.04473
    if whole and not unit and len(digits) == 4 and 1950 <= int(digits) <= 2035:
        return "year"
    if whole and not unit and int(digits.replace(",", "")) < 10:
        return "small count"
    return None


def _tolerance(m: re.Match) -> float:
    """Half a unit of the last digit the numeral states; a whole number's trailing zeros are
    read as rounding, keeping two significant digits (18,500: ±50; 1,000: ±50)."""
    digits = m.group("int").replace(",", "")
    exponent = int(m.group("exp")[1:]) if m.group("exp") else 0
    if m.group("frac"):
        place = -(len(m.group("frac")) - 1)
    else:
        zeros = len(digits) - len(digits.rstrip("0")) if digits.strip("0") else 0
        place = max(0, min(zeros, len(digits) - 2))
    return 0.5 * 10.0 ** (place + exponent)


def stated_numbers(source: str, *, notebook: str = "", cell: str = "") -> list[Stated]:
    """The numbers stated in the markdown ``source`` of one cell, in order."""
    text = _masked(source)
    spans = sentence_spans(source)
    found, previous = [], (0, None)
    for m in _NUMERAL.finditer(text):
        why = _why_not_stated(text, m, previous)
        previous = (m.end(), why)
        if why is not None:
            continue
        written = m.group("int") + (m.group("frac") or "") + (m.group("exp") or "")
        found.append(
            Stated(
                notebook,
                cell,
                written,
                float(written.replace(",", "")),
                _tolerance(m),
                m.start(),
                m.end(),
                sentence_at(source, m.start(), spans),
                unit=_unit(text, m) or "",
            )
        )
    return found


__all__ = ["NUMBERING", "UNITS", "VERSIONED", "Stated", "stated_numbers"]
