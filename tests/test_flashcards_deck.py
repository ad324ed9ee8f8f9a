"""The real course deck (flashcards/deck/*.yaml): valid, unique ids, every number recomputed.

Each numeric check is its own test, named ``test_deck_number[<card-id>#<n>]``; a failure
prints the file, the card, the expression, what distlab computed and what the card states.
Run only these with ``pytest tests/test_flashcards_deck.py``.
"""

from __future__ import annotations

import re

import pytest

from flashcards.checks import run_check
from flashcards.model import DeckError, card_id_for, default_deck_dir, load_deck

MIN_CARDS = 150  # issue 6: "at least 150 cards"


def _load():
    try:
        return load_deck(default_deck_dir()), None
    except DeckError as exc:
        return None, exc


DECK, DECK_ERROR = _load()
CHECKS = (
    []
    if DECK is None
    else [(card, i, check) for card in DECK for i, check in enumerate(card.checks)]
)


def test_deck_is_valid():
    assert DECK_ERROR is None, f"the course deck does not load: {DECK_ERROR}"
    assert len(DECK) >= MIN_CARDS, (
        f"the deck has {len(DECK)} cards; the course needs at least {MIN_CARDS}"
    )
    slugs = [c.slug for c in DECK]
    assert len(set(slugs)) == len(slugs)
    assert len({card_id_for(s) for s in slugs}) == len(slugs)
    assert set(DECK.titles) == {p.stem for p in default_deck_dir().glob("*.yaml")}


def test_every_stated_text_is_in_its_card():
    assert DECK is not None, DECK_ERROR
    missing = [
        f"{card.source} {card.slug}: {check.text!r}"
        for card, _, check in CHECKS
        if not any(check.text in text for text in (card.q, card.a, card.cloze))
    ]
    assert not missing, "check texts not found in q or a:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("card", "index", "check"), CHECKS, ids=[f"{c.slug}#{i}" for c, i, _ in CHECKS]
)
def test_deck_number(card, index, check):
    result = run_check(card, check)
    if not result.ok:
        pytest.fail(result.message(), pytrace=False)


# ------------------------------------------------------------- one card, one question ---
# Issue 11: a card that asks several things is reviewed as one rating, so the learner cannot
# tell the scheduler which part they forgot. The heuristic below flags a basic card when
#   1. its question asks two questions: two "?" outside math and code, or a second question
#      joined by ", and what / which / how many / how much / how big / where / when";
#   2. it asks for three or more values: three or more numeric checks with different texts;
#   3. its answer is a list of six or more items: six or more bullet lines, or a first sentence
#      (parenthesised asides left out) of six or more items separated by commas or semicolons,
#      counting a closing "and" / "or" item.
# "What is X, and why?" passes on purpose: the why is the explanation of the one fact asked.
# Cloze cards ask one deletion per card and are not checked. Formulas and layouts with many
# parts belong in cloze cards (type: cloze), one deletion per part.
_SECOND_QUESTION = re.compile(
    r"[,;]\s*and\s+(?:what|which|how many|how much|how big|where|when)\b", re.IGNORECASE
)


def _without_math_and_code(text: str) -> str:
    text = re.sub(r"\$\$.*?\$\$", "M", text, flags=re.DOTALL)
    text = re.sub(r"\$[^$]*\$", "M", text)
    return re.sub(r"`[^`]*`", "C", text)


def _first_sentence(text: str) -> str:
    paragraph = _without_math_and_code(text).split("\n\n")[0]
    paragraph = " ".join(re.sub(r"\([^()]*\)", "", paragraph).split())
    return re.split(r"(?<=[.!])\s", paragraph)[0]


def asks_more_than_one_thing(card) -> list[str]:
    """Why ``card`` asks more than one thing (empty if it asks one), by the heuristic above."""
    if card.kind == "cloze":
        return []
    why = []
    q = _without_math_and_code(card.q)
    if q.count("?") >= 2 or _SECOND_QUESTION.search(q):
        why.append("asks two questions")
    values = {check.text for check in card.checks}
    if len(values) >= 3:
        why.append(f"asks for {len(values)} values")
    sentence = _first_sentence(card.a)
    items = 1 + len(re.findall(r"[,;]", sentence))
    items += 1 if re.search(r",[^,;]* (?:and|or) ", sentence) else 0
    bullets = len(re.findall(r"^\s*(?:[-*]|\d+\.)\s", card.a, re.MULTILINE))
    if max(items, bullets) >= 6:
        why.append(f"lists {max(items, bullets)} items")
    return why


@pytest.mark.parametrize(
    ("q", "a", "checks", "flagged"),
    [
        ("What is X? And why?", "x", 0, True),
        ("Ring all-reduce: how many steps, and how big is each message?", "x", 0, True),
        ("What is gang scheduling, and why does a job need it?", "x", 0, False),
        ("Amdahl speedup on 8, 64 and 256 GPUs?", "x", 3, True),
        ("Which variables does torchrun set?", "`A`, `B`, `C`, `D`, `E` and `F`.", 0, True),
        ("Which variables does torchrun set?", "`A`, `B` and `C` (and `D`, `E`, `F`).", 0, False),
        ("What is $f(a, b)$? $x?$", "- a\n- b\n- c\n- d\n- e\n- f", 0, True),
        ("How many bytes does Adam keep per parameter?", "16: 2 + 2 + 12.", 2, False),
    ],
)
def test_the_one_question_heuristic(q, a, checks, flagged):
    from flashcards.model import Card, Check

    card = Card(
        slug="x",
        card_id=1,
        topic="t",
        tags=("t", "core"),
        notebook="02-collectives",
        q=q,
        a=a,
        checks=tuple(Check(expr="1", value=1, text=f"v{i}") for i in range(checks)),
    )
    assert bool(asks_more_than_one_thing(card)) is flagged, asks_more_than_one_thing(card)


def _assert_no_card_flagged(check, what: str) -> None:
    """Fail listing every card for which ``check`` returns reasons, each with its reasons."""
    flagged = {c.slug: check(c) for c in DECK}
    flagged = {slug: why for slug, why in flagged.items() if why}
    assert not flagged, f"{what}:\n" + "\n".join(
        f"{slug}: {', '.join(why)}" for slug, why in flagged.items()
    )


def test_every_card_asks_one_thing():
    assert DECK is not None, DECK_ERROR
    _assert_no_card_flagged(
        asks_more_than_one_thing,
        "cards that ask more than one thing (split them, or make them cloze)",
    )


# ------------------------------------------------------ filed where it is first taught ---
# Issue 27: a card drilled with `--up-to NN` must not ask about what a later notebook teaches
# (`coll-float-sum-order` asked about the tree all-reduce of notebook 03 under notebook 02).
# A question that names one of these subjects is filed in the notebook that teaches it, or later.
FIRST_TAUGHT = (
    (r"\btree\b|halving-doubling|recursive (?:halving|doubling)|alpha-beta|\bbusbw\b|\balgbw\b",
     "03-algorithms-and-cost"),
    (r"linear scaling rule|warmup|\bLARS\b|\bLAMB\b", "04-data-parallelism"),
    (r"ZeRO-\d|ZeRO stage|\bFSDP\b|fully_shard", "06-zero-and-fsdp"),
    (r"1F1B|GPipe|pipeline bubble", "08-pipeline-parallelism"),
    (r"expert parallel|\bMoE\b", "09-3d-parallelism-and-placement"),
    (r"Amdahl|Gustafson|\bMFU\b", "11-scaling-and-compilers"),
)  # fmt: skip


def filed_too_early(card) -> list[str]:
    """The subjects ``card``'s question names that its notebook comes before."""
    from flashcards.model import NOTEBOOK_FOLDERS

    position = NOTEBOOK_FOLDERS.index(card.notebook_folder)
    question = card.cloze or card.q
    return [
        f"{match.group(0)!r} (taught in {folder})"
        for pattern, folder in FIRST_TAUGHT
        if (match := re.search(pattern, question)) and position < NOTEBOOK_FOLDERS.index(folder)
    ]


def test_the_first_taught_rule_flags_a_misfiled_card():
    from dataclasses import replace

    assert DECK is not None, DECK_ERROR
    card = DECK.by_slug("coll-float-sum-order")
    assert filed_too_early(card) == []
    assert filed_too_early(replace(card, notebook="02-collectives#all-reduce")) == [
        "'tree' (taught in 03-algorithms-and-cost)"
    ]


def test_no_card_asks_about_a_later_notebook():
    assert DECK is not None, DECK_ERROR
    _assert_no_card_flagged(
        filed_too_early, "cards filed before the notebook that teaches their subject"
    )
