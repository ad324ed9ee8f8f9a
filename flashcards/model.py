"""Cards and decks: load the YAML card files and check their shape.

A deck is a folder of YAML files, one per topic (``flashcards/deck/<topic>.yaml``)::

    topic: collectives
    title: Collective communication
    cards:
      - id: coll-allreduce-start-end      # stable slug, never renamed
        tags: [collectives, basic]        # [a-z0-9-]+, one difficulty tag
        notebook: "02-collectives#all-reduce"
        q: Markdown question, math in $...$
        a: Markdown answer
        checks:                           # optional numeric checks (see flashcards.checks)
          - {expr: "calc.scaling.amdahl_speedup(0.05, 8)", value: 5.93, text: "5.9x"}
      - id: cloze-ring-cost                 # a cloze note: Anki's {{c1::...}} deletions
        type: cloze
        tags: [collectives, core]
        notebook: "03-algorithms-and-cost#ring"
        text: Ring all-reduce costs {{c1::$2(n-1)\alpha$}} + {{c2::$2\frac{n-1}{n}N\beta$}}.
        extra: Optional Markdown shown under the answer.

A cloze note becomes one card per deletion number, with id ``<id>-c<n>`` (as Anki makes one
card per number of a Cloze note); its ``q`` and ``a`` are the text with deletion ``n`` hidden
and revealed (:func:`flashcards.render.cloze_front` / :func:`~flashcards.render.cloze_back`),
so every reviewer (widget, terminal) shows it like any other card.

The format is the contract in ``notes/deck_format.md``. Every problem is reported as a
:class:`DeckError` naming the file, the card (id or position) and the field, including three
that YAML itself lets through: a file that is not UTF-8 (the error gives the byte offset), a
key written twice in one mapping (YAML would keep the last value without a word), and an
anchor or alias (``&name`` / ``*name``): card files write every value out, and a few aliases
nested in each other ("billion laughs") would make the loader walk an exponential tree, so
they are refused while the file is read, before anything is expanded.

FSRS and Anki want integer card ids; :func:`card_id_for` derives one from the slug with
SHA-256, so the id survives edits of the text and a reordering of the files.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flashcards.render import cloze_back, cloze_front, cloze_inside_math, cloze_numbers

DIFFICULTIES = ("basic", "core", "advanced")
NOTEBOOK_FOLDERS = (
    "00-launching",
    "01-memory-anatomy",
    "02-collectives",
    "03-algorithms-and-cost",
    "04-data-parallelism",
    "05-mixed-precision",
    "06-zero-and-fsdp",
    "07-tensor-and-sequence-parallelism",
    "08-pipeline-parallelism",
    "09-3d-parallelism-and-placement",
    "10-checkpointing-and-elasticity",
    "11-scaling-and-compilers",
    "12-designing-a-training-run",
    "13-sharded-matmuls-and-overlap",
)
DEFAULT_REL_TOL = 1e-3
DECK_ENV_VAR = "DISTLAB_FLASHCARDS_DECK"

#: a slug: lower-case words of a-z and 0-9 joined by single "-" (card ids, notebook section anchors)
SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_CARD_KEYS = {"id", "type", "tags", "notebook", "q", "a", "text", "extra", "checks"}
CARD_TYPES = ("basic", "cloze")
_FIELDS_OF_TYPE = {"basic": ("q", "a"), "cloze": ("text",)}
_OPTIONAL_OF_TYPE = {"basic": (), "cloze": ("extra",)}
_CHECK_KEYS = {"expr", "value", "rel_tol", "text"}
_FILE_KEYS = {"topic", "title", "cards"}
_ID_BITS = 52  # exact in a JSON double, so ids survive JavaScript and every JSON tool

try:  # libyaml parses the whole deck about 7x faster than the pure-Python loader
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader


class DeckError(ValueError):
    """A card file that does not follow the deck format; the message says where."""


@dataclass(frozen=True)
class Check:
    """A number stated in a card, and the expression that computes it.

    ``expr`` is evaluated by :func:`flashcards.checks.evaluate` with ``calc``, ``sim`` and
    ``math`` in scope; the result must be within ``rel_tol`` of ``value``, and ``text``
    is the exact substring of the card that states the number.
    """

    expr: str
    value: float
    text: str
    rel_tol: float = DEFAULT_REL_TOL


@dataclass(frozen=True)
class Card:
    """One flashcard as written in the deck (its review state lives in the store)."""

    slug: str
    card_id: int
    topic: str
    tags: tuple[str, ...]
    notebook: str
    q: str
    a: str
    checks: tuple[Check, ...] = ()
    source: Path | None = field(default=None, compare=False)
    index: int = field(default=0, compare=False)
    kind: str = "basic"  # or "cloze"
    note: str = ""  # the deck entry's id: the slug, or a cloze note's id for its cards
    cloze: str = ""  # a cloze note's text with every {{cN::...}} deletion
    extra: str = ""  # a cloze note's optional extra text

    def __post_init__(self) -> None:
        if not self.note:
            object.__setattr__(self, "note", self.slug)

    @property
    def notebook_folder(self) -> str:
        """``"02-collectives"`` for ``notebook: "02-collectives#all-reduce"``."""
        return self.notebook.split("#", 1)[0]

    @property
    def difficulty(self) -> str:
        return next(t for t in self.tags if t in DIFFICULTIES)

    def matches(self, tag: str | None = None, notebook: str | None = None) -> bool:
        """True if the card has ``tag`` and belongs to ``notebook``.

        ``notebook`` is a folder (``"02-collectives"``, every section) or a full anchor
        (``"02-collectives#all-reduce"``, that section only).
        """
        if tag is not None and tag not in self.tags:
            return False
        if notebook is not None:
            wanted = notebook if "#" in notebook else None
            if wanted is not None and self.notebook != wanted:
                return False
            if wanted is None and self.notebook_folder != notebook:
                return False
        return True


@dataclass(frozen=True)
class Deck:
    """All cards of a deck, in file order (files sorted by name, cards as written)."""

    cards: tuple[Card, ...]
    titles: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {c.card_id: c for c in self.cards})
        object.__setattr__(self, "_by_slug", {c.slug: c for c in self.cards})

    def __len__(self) -> int:
        return len(self.cards)

    def __iter__(self):
        return iter(self.cards)

    def by_id(self, card_id: int) -> Card | None:
        return self._by_id.get(card_id)  # type: ignore[attr-defined]

    def by_slug(self, slug: str) -> Card:
        try:
            return self._by_slug[slug]  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError(f"no card with id {slug!r} in this deck") from None

    def filter(self, tag: str | None = None, notebook: str | None = None) -> list[Card]:
        return [c for c in self.cards if c.matches(tag=tag, notebook=notebook)]

    @property
    def tags(self) -> list[str]:
        return sorted({t for c in self.cards for t in c.tags})


def card_id_for(slug: str) -> int:
    """Stable positive integer id of a card: the first 52 bits of SHA-256("distlab:" + slug).

    52 bits keep the id exact in JSON numbers (IEEE doubles); with a few thousand cards
    the chance of a collision is below 1e-9, and :func:`load_deck` rejects one anyway.
    """
    digest = hashlib.sha256(f"distlab:{slug}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> (64 - _ID_BITS)) or 1


def default_deck_dir() -> Path:
    """The deck shipped with the package, or the folder named by ``$DISTLAB_FLASHCARDS_DECK``."""
    override = os.environ.get(DECK_ENV_VAR)
    return Path(override) if override else Path(__file__).parent / "deck"


def load_deck(path: str | os.PathLike | None = None) -> Deck:
    """Load every ``*.yaml`` card file of a deck folder (or one file) and validate it.

    Raises :class:`DeckError` naming the file, card and field of the first problem, or
    both files of a duplicated card id.
    """
    root = Path(path) if path is not None else default_deck_dir()
    if root.is_dir():
        files = sorted(root.glob("*.yaml"))
    elif root.is_file():
        files = [root]
    else:
        raise DeckError(f"{root}: no such deck folder or card file")
    cards: list[Card] = []
    titles: dict[str, str] = {}
    seen: dict[int, Card] = {}
    for file in files:
        topic, title, file_cards = load_card_file(file)
        titles[topic] = title
        for card in file_cards:
            other = seen.get(card.card_id)
            if other is not None:
                what = "duplicate card id" if other.slug == card.slug else "card id hash collision"
                raise DeckError(
                    f"{what} {card.slug!r}: {_where(other)} and {_where(card)}"
                    + ("" if other.slug == card.slug else f" (with {other.slug!r}); rename one")
                )
            seen[card.card_id] = card
            cards.append(card)
    return Deck(cards=tuple(cards), titles=titles)


def load_card_file(path: str | os.PathLike) -> tuple[str, str, list[Card]]:
    """Parse and validate one topic file; returns ``(topic, title, cards)``."""
    path = Path(path)
    data = _parse_yaml(path)
    if not isinstance(data, dict):
        raise DeckError(f"{path}: expected a mapping with keys topic, title, cards")
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise DeckError(
            f"{path}: unknown top-level field(s) {unknown}; allowed: topic, title, cards"
        )
    topic = data.get("topic")
    if topic != path.stem:
        raise DeckError(
            f"{path}: field 'topic' is {topic!r}; it must equal the file name {path.stem!r}"
        )
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        raise DeckError(f"{path}: field 'title' must be a non-empty string, got {title!r}")
    raw_cards = data.get("cards")
    if not isinstance(raw_cards, list):
        raise DeckError(
            f"{path}: field 'cards' must be a list of cards, got {type(raw_cards).__name__}"
        )
    cards = []
    slugs: dict[str, int] = {}
    for index, raw in enumerate(raw_cards, start=1):
        for card in _parse_card(raw, path=path, index=index, topic=topic):
            if card.slug in slugs:
                raise DeckError(
                    f"{path}: duplicate card id {card.slug!r} "
                    f"(cards #{slugs[card.slug]} and #{index})"
                )
            slugs[card.slug] = index
            cards.append(card)
    return topic, title, cards


def _parse_yaml(path: Path) -> Any:
    """The YAML document of a card file, refusing text that is not UTF-8 (naming the byte)
    and a mapping that repeats a key (YAML would keep the last value without a word)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DeckError(
            f"{path}: not UTF-8 text: byte {exc.start} (line {line}) is "
            f"0x{raw[exc.start]:02x}; save the card file as UTF-8"
        ) from None
    _refuse_anchors(path, text)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        repeated = _repeated_key(node)
        if repeated is not None:
            raise DeckError(f"{path}: {repeated}")
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise DeckError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _refuse_anchors(path: Path, text: str) -> None:
    """A :class:`DeckError` at the first anchor (``&name``) or alias (``*name``) of a card
    file, found in the parser's event stream (linear in the text, nothing expanded); files
    with neither character are not parsed twice. Invalid YAML is left to the loader."""
    if "&" not in text and "*" not in text:
        return
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
                raise DeckError(
                    f"{path}: line {event.start_mark.line + 1}: YAML {kind}{event.anchor} is "
                    "not allowed: card files may not use anchors or aliases (&name, *name); "
                    "write the value out in full"
                )
    except yaml.YAMLError:
        return  # _parse_yaml reports it with the loader's own words


def _repeated_key(root: yaml.Node | None) -> str | None:
    """Where the first repeated key of a card file is, in the deck's words, or None."""
    if not isinstance(root, yaml.MappingNode):
        return None  # not a mapping: load_card_file says so
    for name, key, first, second in _repeated_keys(root):
        if "." not in name and "[" not in name:
            return f"top-level field {key!r} appears twice ({_lines(first, second)}); keep one"
    for key_node, value in root.value:
        if key_node.value != "cards" or not isinstance(value, yaml.SequenceNode):
            continue
        for index, card in enumerate(value.value, start=1):
            for name, _, first, second in _repeated_keys(card):
                slug = _scalar_field(card, "id")
                where = f"card {slug!r} (#{index})" if slug else f"card #{index}"
                return (
                    f"{where}: field {name!r} appears twice ({_lines(first, second)}); "
                    "YAML would keep only the last one"
                )
    return None


def _lines(first: int, second: int) -> str:
    return f"lines {first} and {second}" if first != second else f"both on line {first}"


def _repeated_keys(node: yaml.Node, at: str = ""):
    """``(field, key, first line, second line)`` for each key that a mapping in ``node``
    repeats; ``field`` names it from ``node`` down (``checks[0].expr``)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            name = f"{at}.{key}" if at else key
            line = key_node.start_mark.line + 1
            if key in seen and isinstance(key_node, yaml.ScalarNode):
                yield name, key, seen[key], line
            seen.setdefault(key, line)
            yield from _repeated_keys(value, name)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _repeated_keys(item, f"{at}[{index}]")


def _scalar_field(node: yaml.Node, key: str) -> str | None:
    """The first ``key: value`` scalar of a mapping node (the card id, before construction)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            if key_node.value == key and isinstance(value, yaml.ScalarNode):
                return value.value
    return None


def _where(card: Card) -> str:
    return f"{card.source} (card #{card.index})"


def _parse_card(raw: Any, *, path: Path, index: int, topic: str) -> list[Card]:
    """The cards of one deck entry: one for a basic card, one per deletion of a cloze note."""
    where = f"{path}: card #{index}"
    if not isinstance(raw, dict):
        raise DeckError(f"{where}: expected a mapping with fields {sorted(_CARD_KEYS)}")
    slug = raw.get("id")
    if not isinstance(slug, str) or not SLUG.match(slug):
        raise DeckError(f"{where}: field 'id' must be a slug of [a-z0-9-]+, got {slug!r}")
    where = f"{path}: card {slug!r} (#{index})"

    def fail(field_name: str, message: str) -> DeckError:
        return DeckError(f"{where}: field {field_name!r} {message}")

    unknown = sorted(set(raw) - _CARD_KEYS)
    if unknown:
        raise fail(unknown[0], f"is not a card field; allowed: {sorted(_CARD_KEYS)}")
    tags = raw.get("tags")
    if not isinstance(tags, list) or not tags:
        raise fail("tags", f"must be a non-empty list, got {tags!r}")
    for tag in tags:
        if not isinstance(tag, str) or not SLUG.match(tag):
            raise fail("tags", f"has {tag!r}; tags are [a-z0-9-]+ without spaces")
    if tags[0] != topic:
        raise fail("tags", f"must start with the topic tag {topic!r}, got {tags!r}")
    difficulties = [t for t in tags if t in DIFFICULTIES]
    if len(difficulties) != 1:
        raise fail("tags", f"must hold exactly one difficulty of {DIFFICULTIES}, got {tags!r}")
    if len(set(tags)) != len(tags):
        raise fail("tags", f"repeats a tag: {tags!r}")
    notebook = raw.get("notebook")
    folder, _, anchor = notebook.partition("#") if isinstance(notebook, str) else ("", "", "")
    if folder not in NOTEBOOK_FOLDERS or (anchor and not SLUG.match(anchor)):
        raise fail(
            "notebook",
            f"is {notebook!r}; expected '<folder>#<section>' with folder one of {NOTEBOOK_FOLDERS}",
        )
    kind = raw.get("type", "basic")
    if kind not in CARD_TYPES:
        raise fail("type", f"is {kind!r}; allowed: {CARD_TYPES}")
    texts = {}
    for name in _FIELDS_OF_TYPE[kind] + _OPTIONAL_OF_TYPE[kind]:
        value = raw.get(name)
        if value is None and name in _OPTIONAL_OF_TYPE[kind]:
            continue
        if not isinstance(value, str) or not value.strip():
            raise fail(name, f"must be non-empty Markdown text, got {value!r}")
        texts[name] = value.strip()
    for name in sorted(set(raw) & {"q", "a", "text", "extra"}):
        if name not in texts:
            raise fail(name, f"is not a field of a {kind} card; it has {_FIELDS_OF_TYPE[kind]}")
    common = {
        "topic": topic,
        "tags": tuple(tags),
        "notebook": notebook,
        "source": path,
        "index": index,
    }
    if kind == "basic":
        checks = parse_checks(raw.get("checks", []), fail=fail, q=texts["q"], a=texts["a"])
        return [
            Card(
                slug=slug,
                card_id=card_id_for(slug),
                q=texts["q"],
                a=texts["a"],
                checks=checks,
                **common,
            )
        ]
    return _cloze_cards(raw, slug, texts["text"], texts.get("extra", ""), fail, common)


def _cloze_cards(raw: dict, slug: str, text: str, extra: str, fail, common: dict) -> list[Card]:
    numbers = cloze_numbers(text)
    if not numbers:
        raise fail("text", "has no cloze deletion; write one as {{c1::answer}}")
    inside = cloze_inside_math(text)
    if inside is not None:
        raise fail("text", f"has the deletion {inside!r} inside a formula; wrap whole formulas")
    checks = parse_checks(raw.get("checks", []), fail=fail, q=text, a=extra or text)
    cards = []
    for number in numbers:
        card_slug = f"{slug}-c{number}"
        back = cloze_back(text, number) + (f"\n\n{extra}" if extra else "")
        cards.append(
            Card(
                slug=card_slug,
                card_id=card_id_for(card_slug),
                q=cloze_front(text, number),
                a=back,
                checks=checks,
                kind="cloze",
                note=slug,
                cloze=text,
                extra=extra,
                **common,
            )
        )
    return cards


def parse_checks(raw: Any, *, fail, q: str, a: str) -> tuple[Check, ...]:
    """The :class:`Check` list ``raw`` as read from YAML or JSON, checked for shape: each
    ``text`` must be in ``q`` or ``a``; ``fail(field, message)`` builds the error to raise.
    A card's ``checks`` and a notebook cell's number ties
    (:mod:`distlab.site.stated_numbers`) are read with it."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise fail("checks", f"must be a list of checks, got {type(raw).__name__}")
    checks = []
    for i, item in enumerate(raw):
        name = f"checks[{i}]"
        if not isinstance(item, dict):
            raise fail(name, f"must be a mapping with {sorted(_CHECK_KEYS)}, got {item!r}")
        unknown = sorted(set(item) - _CHECK_KEYS)
        if unknown:
            raise fail(
                f"{name}.{unknown[0]}", f"is not a check field; allowed: {sorted(_CHECK_KEYS)}"
            )
        expr = item.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            raise fail(f"{name}.expr", f"must be a Python expression string, got {expr!r}")
        try:
            compile(expr, "<check>", "eval")
        except SyntaxError as exc:
            raise fail(f"{name}.expr", f"is not a valid expression ({exc.msg}): {expr!r}") from None
        value = item.get("value")
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise fail(f"{name}.value", f"must be a finite number, got {value!r}")
        rel_tol = item.get("rel_tol", DEFAULT_REL_TOL)
        if isinstance(rel_tol, bool) or not isinstance(rel_tol, int | float) or not 0 < rel_tol < 1:
            raise fail(f"{name}.rel_tol", f"must be a number in (0, 1), got {rel_tol!r}")
        text = item.get("text")
        if not isinstance(text, str) or not text:
            raise fail(
                f"{name}.text", f"must be the substring of q or a stating the number, got {text!r}"
            )
        if text not in q and text not in a:
            raise fail(f"{name}.text", f"{text!r} appears in neither q nor a")
        checks.append(Check(expr=expr, value=float(value), text=text, rel_tol=float(rel_tol)))
    return tuple(checks)
