"""Scheduling flow with a fixed clock: queue order, new-card limit, leeches, undo, retention."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fsrs
import pytest
from fsrs import Rating, State

from flashcards.course_order import in_course_order, notebook_sections, section_anchor
from flashcards.model import NOTEBOOK_FOLDERS, default_deck_dir, load_deck
from flashcards.scheduler import (
    LEECH_THRESHOLD,
    StoredCard,
    becomes_leech,
    build_queue,
    day_window,
    format_interval,
    make_scheduler,
)
from flashcards.session import DrillSession
from flashcards.store import Store

TEST_DECK = Path(__file__).parent / "data" / "deck"
START = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self, start: datetime = START) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs) -> None:
        self.now += timedelta(**kwargs)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def session(tmp_path, clock):
    return new_session(tmp_path / "reviews.db", clock)


def new_session(db, clock, **kwargs) -> DrillSession:
    kwargs.setdefault("scheduler", make_scheduler(enable_fuzzing=False))
    return DrillSession(TEST_DECK, Store(db), clock=clock, tz=UTC, **kwargs)


def test_first_reviews_follow_fsrs_and_learning_steps(session, clock):
    assert session.counts.new == 6 and session.counts.learning == 0 and session.counts.review == 0
    first = session.current
    # new cards in course order: notebook 02's "Reduce-scatter" section comes before
    # "All-gather" and "Ring all-reduce" (flashcards.course_order)
    assert first.slug == "words-reduce-scatter"
    # The labels are what the fsrs scheduler itself gives a new card.
    reference = fsrs.Scheduler(enable_fuzzing=False)
    for rating, label in session.labels().items():
        after, _ = reference.review_card(
            fsrs.Card(card_id=first.card_id), rating, review_datetime=START
        )
        assert label == f"{rating.name} · {format_interval(after.due - START)}"
    assert session.labels()[Rating.Good] == "Good · 10m"  # fsrs default learning steps 1m, 10m

    session.rate(Rating.Good)
    state = session.store.card_state(first.card_id)
    assert state.card.state == State.Learning and state.card.due == START + timedelta(minutes=10)
    # Not due yet: the next new card comes first, the learning card waits (learn-ahead) at the end.
    assert session.current.slug == "words-all-gather"
    assert session.queue[-1].slug == first.slug
    assert (session.counts.new, session.counts.learning) == (5, 1)

    clock.advance(minutes=10)
    session.refresh()
    assert session.current.slug == first.slug  # a due learning card goes first
    session.rate(Rating.Good)
    state = session.store.card_state(first.card_id)
    assert state.card.state == State.Review
    assert state.card.due >= START + timedelta(days=1)
    assert first.card_id not in {c.card_id for c in session.queue}
    assert session.reviewed_today == 2


def test_queue_order_learning_due_then_reviews_oldest_first_then_new_then_learn_ahead():
    cards = list(load_deck(TEST_DECK))
    now = START

    def stored(card, state, due):
        fsrs_card = fsrs.Card(
            card_id=card.card_id, state=state, stability=5.0, difficulty=5.0, due=due
        )
        fsrs_card.step = None if state == State.Review else 0
        return StoredCard(card.card_id, card.slug, fsrs_card, 1, 0, False, False, 1)

    states = {
        cards[0].card_id: stored(cards[0], State.Review, now + timedelta(hours=3)),
        cards[1].card_id: stored(cards[1], State.Review, now - timedelta(days=2)),
        cards[2].card_id: stored(cards[2], State.Review, now + timedelta(hours=1)),
        cards[3].card_id: stored(cards[3], State.Learning, now - timedelta(minutes=1)),
        cards[4].card_id: stored(cards[4], State.Relearning, now + timedelta(minutes=5)),
    }
    _, day_end = day_window(now, tz=UTC)
    queue = build_queue(cards, states, now=now, day_end=day_end, new_left=20)
    assert [cards.index(c) for c in queue.cards] == [3, 1, 2, 0, 5, 4]
    assert (queue.counts.new, queue.counts.learning, queue.counts.review) == (1, 2, 3)
    states[cards[2].card_id] = stored(
        cards[2], State.Review, day_end + timedelta(hours=1)
    )  # tomorrow
    states[cards[5].card_id] = replace(
        states[cards[0].card_id], card_id=cards[5].card_id, suspended=True
    )
    queue = build_queue(cards, states, now=now, day_end=day_end, new_left=20)
    assert [cards.index(c) for c in queue.cards] == [3, 1, 0, 4]
    assert queue.next_due == day_end + timedelta(hours=1)
    assert build_queue(cards[5:], {}, now=now, day_end=day_end, new_left=0).cards == ()


def test_daily_new_card_limit_counts_across_sessions_and_resets_at_4am(tmp_path, clock):
    session = new_session(tmp_path / "r.db", clock, new_per_day=2)
    assert session.counts.new == 2
    session.rate(Rating.Easy)
    session.rate(Rating.Easy)
    assert session.counts.new == 0 and session.current is None
    other = new_session(tmp_path / "r.db", clock, new_per_day=2)  # e.g. the terminal drill
    assert other.counts.new == 0
    clock.now = datetime(2025, 3, 4, 3, 59, tzinfo=UTC)  # still the same study day
    other.refresh()
    assert other.counts.new == 0
    clock.now = datetime(2025, 3, 4, 4, 0, tzinfo=UTC)
    other.refresh()
    assert other.counts.new == 2


def test_a_card_lapsing_eight_times_is_a_leech_and_suspended(session, clock):
    card = session.current
    session.rate(Rating.Easy)  # straight to Review
    results = []
    for _ in range(LEECH_THRESHOLD):
        clock.now = session.store.card_state(card.card_id).card.due
        session.refresh()
        assert session.current == card
        results.append(session.rate(Rating.Again))  # lapse: Review -> Relearning
        if results[-1].became_leech:
            break
        clock.now = session.store.card_state(card.card_id).card.due
        session.refresh()
        session.rate(Rating.Good)  # relearned: back to Review
    assert [r.became_leech for r in results] == [False] * 7 + [True]
    state = session.store.card_state(card.card_id)
    assert state.lapses == 8 and state.leech and state.suspended
    clock.advance(days=30)
    session.refresh()
    assert card not in session.queue  # suspended cards are never shown
    session.store.set_suspended(card.card_id, False)
    session.refresh()
    assert card in session.queue
    assert session.store.card_state(card.card_id).leech  # still tagged


def test_leech_rule_threshold_then_every_half_threshold():
    assert [n for n in range(1, 21) if becomes_leech(n)] == [8, 12, 16, 20]


def test_undo_rebuilds_the_card_from_its_log(session, clock):
    a = session.current
    session.rate(Rating.Good)
    b = session.current
    before = session.counts
    session.rate(Rating.Easy)
    assert session.undo() == b
    assert session.store.card_state(b.card_id) is None  # new again: no log rows left
    assert session.current == b and session.counts == before
    assert session.reviewed_today == 1

    clock.advance(minutes=10)
    session.refresh()
    after_first = session.store.card_state(a.card_id)
    assert session.current == a  # its 10-minute learning step is due
    session.rate(Rating.Hard)
    assert session.store.card_state(a.card_id).last_review_id != after_first.last_review_id
    session.undo()
    restored = session.store.card_state(a.card_id)
    assert restored.card.to_dict() == after_first.card.to_dict()
    assert restored.reps == 1
    assert session.current == a
    session.undo()
    assert session.store.card_state(a.card_id) is None
    with pytest.raises(ValueError, match="nothing to undo"):
        session.undo()


def test_undo_of_the_leech_making_lapse_unsuspends(session, clock):
    card = session.current
    session.rate(Rating.Easy)
    for _ in range(LEECH_THRESHOLD):
        clock.now = session.store.card_state(card.card_id).card.due
        session.refresh()
        result = session.rate(Rating.Again)
        clock.now = session.store.card_state(card.card_id).card.due
        session.refresh()
        if not result.became_leech:
            session.rate(Rating.Good)
    assert session.store.card_state(card.card_id).suspended
    session.undo()
    state = session.store.card_state(card.card_id)
    assert (state.lapses, state.leech, state.suspended) == (7, False, False)


def test_log_replays_to_the_cached_state(session, clock):
    # Without fuzz FSRS is deterministic, so replaying the log with the library must
    # reproduce the cache exactly: the log really is the source of truth.
    for rating in [Rating.Good, Rating.Again, Rating.Good, Rating.Easy, Rating.Hard, Rating.Good]:
        clock.advance(minutes=11)
        session.refresh()
        session.rate(rating)
    scheduler = make_scheduler(enable_fuzzing=False)
    for card_id, state in session.store.card_states().items():
        logs = [
            fsrs.ReviewLog(card_id, r.rating, r.reviewed_at, r.duration_ms)
            for r in session.store.reviews(card_id=card_id)
        ]
        replayed = scheduler.reschedule_card(fsrs.Card(card_id=card_id), logs)
        assert replayed.to_dict() == state.card.to_dict()


def test_the_interval_on_the_button_is_the_one_applied_even_with_fuzz(tmp_path, clock):
    session = new_session(tmp_path / "r.db", clock, scheduler=make_scheduler(0.9))
    card = session.current
    session.rate(Rating.Easy)
    for _ in range(3):  # grow the interval so fuzz (applied from 3 days up) matters
        clock.now = session.store.card_state(card.card_id).card.due
        session.refresh()
        shown_at = clock.now
        outcome = session.outcomes()[Rating.Good]
        clock.advance(seconds=7)  # the learner thinks for 7 s
        session.rate(Rating.Good)
        due = session.store.card_state(card.card_id).card.due
        assert due == shown_at + outcome.interval + timedelta(seconds=7)


def test_desired_retention_sets_interval_length(tmp_path, clock):
    intervals = {}
    for retention in (0.8, 0.9, 0.95):
        session = new_session(
            tmp_path / f"{retention}.db",
            clock,
            scheduler=make_scheduler(retention, enable_fuzzing=False),
        )
        session.rate(Rating.Easy)
        clock_due = session.store.card_states().popitem()[1].card.due
        intervals[retention] = clock_due - START
    assert intervals[0.8] > intervals[0.9] > intervals[0.95]
    with pytest.raises(ValueError, match="desired_retention"):
        make_scheduler(1.2)
    with pytest.raises(TypeError):
        make_scheduler("high")


def test_two_sessions_on_one_store_never_lose_a_review(tmp_path, clock):
    widget_side = new_session(tmp_path / "r.db", clock)
    terminal_side = new_session(tmp_path / "r.db", clock)
    card = widget_side.current
    widget_side.outcomes()  # the widget shows the card ...
    terminal_side.rate(Rating.Easy)  # ... while the terminal reviews it
    widget_side.rate(Rating.Good)  # scheduled from the terminal's state, not the stale one
    rows = widget_side.store.reviews(card_id=card.card_id)
    assert [r.state_before for r in rows] == [0, State.Review]
    assert widget_side.store.card_state(card.card_id).reps == 2
    with pytest.raises(ValueError, match="reviewed again"):
        terminal_side.undo()  # its review is no longer the card's latest


def test_filters_and_bad_arguments(tmp_path, clock):
    words = new_session(tmp_path / "r.db", clock, tag="words")
    assert {c.topic for c in words.cards} == {"words"} and words.counts.new == 3
    section = new_session(tmp_path / "r.db", clock, notebook="06-zero-and-fsdp#stages")
    assert [c.slug for c in section.cards] == ["words-zero"]
    with pytest.raises(ValueError, match="no card matches tag='nope'.*arithmetic"):
        new_session(tmp_path / "r.db", clock, tag="nope")
    with pytest.raises(ValueError, match="new_per_day"):
        new_session(tmp_path / "r.db", clock, new_per_day=-1)
    with pytest.raises(ValueError, match="rating must be 1-4"):
        words.rate(5)
    with pytest.raises(ValueError, match="naive"):
        DrillSession(TEST_DECK, Store(tmp_path / "r.db"), clock=lambda: datetime(2025, 1, 1))


def test_deck_update_keeps_history(tmp_path, clock):
    deck = tmp_path / "deck"
    shutil.copytree(TEST_DECK, deck)
    session = new_session(tmp_path / "r.db", clock)
    session = DrillSession(
        deck,
        session.store,
        tag="arithmetic",
        clock=clock,
        tz=UTC,
        scheduler=make_scheduler(enable_fuzzing=False),
    )
    session.rate(Rating.Easy)  # arith-ring-steps
    session.rate(Rating.Easy)  # arith-ring-volume
    kept = session.store.card_state(session.deck.by_slug("arith-ring-steps").card_id)

    text = (deck / "arithmetic.yaml").read_text()
    text = text.replace("How many steps does a ring", "Edited: how many steps does a ring")
    start = text.index("  - id: arith-ring-volume")
    end = text.index("  - id: arith-sqrt-two")
    text = text[:start] + text[end:]  # card removed
    text += (
        "\n  - id: arith-new-card\n    tags: [arithmetic, basic]\n    notebook: '00-launching'\n"
        "    q: New?\n    a: Yes.\n"
    )
    (deck / "arithmetic.yaml").write_text(text)

    updated = DrillSession(deck, session.store, clock=clock, tz=UTC)
    edited = updated.deck.by_slug("arith-ring-steps")
    assert edited.q.startswith("Edited")
    assert updated.state_of(edited).card.to_dict() == kept.card.to_dict()
    slugs = {c.slug for c in updated.cards}
    assert "arith-ring-volume" not in slugs and "arith-new-card" in slugs
    assert updated.counts.new == 5  # 4 untouched old cards + the added one
    removed_rows = [r for r in updated.store.reviews() if r.slug == "arith-ring-volume"]
    assert len(removed_rows) == 1  # its history is kept, just not shown


def test_day_window_and_interval_format():
    start, end = day_window(datetime(2025, 3, 3, 2, 0, tzinfo=UTC), tz=UTC)
    assert start == datetime(2025, 3, 2, 4, 0, tzinfo=UTC) and end - start == timedelta(days=1)
    assert [
        format_interval(timedelta(seconds=s))
        for s in (30, 600, 7200, 3 * 86400, 45 * 86400, 800 * 86400)
    ] == [
        "<1m",
        "10m",
        "2h",
        "3d",
        "1.5mo",
        "2.2y",
    ]


# -- course order -------------------------------------------------------------------------
def write_notebook(path: Path, *markdown: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cells = [{"cell_type": "markdown", "metadata": {}, "source": text} for text in markdown]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}))


def test_new_cards_follow_the_notebook_headings(tmp_path):
    """Notebook first, then its sections as its headings appear; notebooks not written yet
    keep the deck's order; a card of a whole notebook comes before its sections."""
    root = tmp_path / "course"
    (root / "nbgrader_config.py").parent.mkdir(parents=True)
    (root / "nbgrader_config.py").write_text("")
    write_notebook(
        root / "solutions" / "02-collectives" / "02-collectives.ipynb",
        "# 02 · Collectives\n## Ring all-reduce\ntext",
        "### Exercise\n## All-gather",
        "## Reduce-scatter",
    )
    order = [c.slug for c in in_course_order(load_deck(TEST_DECK), root=root)]
    assert order == [
        "arith-ring-steps",  # 02#ring-all-reduce, the first heading here
        "arith-ring-volume",
        "words-all-gather",
        "words-reduce-scatter",
        "arith-sqrt-two",  # 03, no notebook written: deck order
        "words-zero",  # 06
    ]
    assert notebook_sections(root / "solutions" / "02-collectives" / "02-collectives.ipynb") == [
        "02-collectives",
        "ring-all-reduce",
        "exercise",
        "all-gather",
        "reduce-scatter",
    ]
    assert section_anchor("DP vs DDP") == "dp-vs-ddp"
    assert section_anchor("`torchrun`: one script") == "torchrun-one-script"


def test_the_real_deck_starts_with_notebook_00_in_section_order():
    session_cards = in_course_order(load_deck(default_deck_dir()))
    folders = [NOTEBOOK_FOLDERS.index(c.notebook_folder) for c in session_cards]
    assert folders == sorted(folders)
    root = Path(__file__).resolve().parents[1]
    first = "00-launching"
    headings = notebook_sections(root / "solutions" / first / f"{first}.ipynb")
    sections = [c.notebook.partition("#")[2] for c in session_cards if c.notebook_folder == first]
    ranks = [headings.index(s) if s in headings else len(headings) for s in sections]
    assert ranks == sorted(ranks) and session_cards[0].notebook_folder == first


def test_up_to_keeps_the_notebooks_done_so_far(tmp_path, clock):
    session = new_session(tmp_path / "r.db", clock, up_to="02")
    assert {c.notebook_folder for c in session.cards} == {"02-collectives"}
    assert len(new_session(tmp_path / "r.db", clock, up_to="3").cards) == 5
    assert len(new_session(tmp_path / "r.db", clock, up_to="06-zero-and-fsdp").cards) == 6
    with pytest.raises(ValueError, match="no card matches .*up_to='01'"):
        new_session(tmp_path / "r.db", clock, up_to="01")
    for bad in ("14", "3a", "-1", "07-tensor"):
        with pytest.raises(
            ValueError, match=rf"up_to \(--up-to\) must be a notebook number 0-13.*got '{bad}'"
        ):
            new_session(tmp_path / "r.db", clock, up_to=bad)
    with pytest.raises(TypeError, match="up_to .--up-to. must be"):
        new_session(tmp_path / "r.db", clock, up_to=3.0)
