"""The ipywidgets drill, driven through its widget objects with a fixed clock and a temp DB."""

from __future__ import annotations

import sys
import threading
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fsrs import Rating, State

import flashcards
from flashcards.scheduler import make_scheduler
from flashcards.session import DrillSession
from flashcards.store import Store
from flashcards.widget import DrillWidget

TEST_DECK = Path(__file__).parent / "data" / "deck"
START = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    now = [START]
    return now


@pytest.fixture
def widget(tmp_path, clock):
    session = DrillSession(
        TEST_DECK,
        Store(tmp_path / "r.db"),
        clock=lambda: clock[0],
        tz=UTC,
        scheduler=make_scheduler(enable_fuzzing=False),
    )
    return DrillWidget(session, keyboard=False)


def visible(w) -> bool:
    return w.layout.display != "none"


def test_question_then_answer_then_rating(widget):
    assert "New 6" in widget.progress.value and "reviewed today: 0" in widget.progress.value
    # Markdown + math rendered for MathJax; the first new card is the course's first section
    assert "<em>reduce-scatter</em>" in widget.question.value
    assert "rank \\(r\\)" in widget.question.value
    assert widget.answer.value == ""
    assert visible(widget.show_button) and not visible(widget.ratings_box)
    assert widget.undo_button.disabled

    widget.show_button.click()
    assert "Shard \\(r\\) of the element-wise sum" in widget.answer.value
    assert not visible(widget.show_button) and visible(widget.ratings_box)
    labels = [b.description for b in widget.rating_buttons.values()]
    assert labels[:3] == ["Again · 1m", "Hard · 6m", "Good · 10m"]
    assert labels[3] == widget.session.labels()[Rating.Easy]

    first = widget.session.current
    widget.rating_buttons[Rating.Good].click()
    state = widget.session.store.card_state(first.card_id)
    assert state.card.state == State.Learning and state.reps == 1
    assert "reviewed today: 1" in widget.progress.value and "Learning 1" in widget.progress.value
    assert widget.session.current != first
    assert widget.answer.value == "" and visible(widget.show_button)
    assert not widget.undo_button.disabled


def test_rating_before_showing_the_answer_does_nothing(widget):
    widget.rating_buttons[Rating.Easy].click()
    assert widget.session.store.reviews() == []


def test_undo_button_restores_the_card(widget):
    first = widget.session.current
    widget.show_button.click()
    widget.rating_buttons[Rating.Easy].click()
    widget.undo_button.click()
    assert widget.session.current == first
    assert widget.session.store.card_state(first.card_id) is None
    assert "Undid" in widget.message.value and "reviewed today: 0" in widget.progress.value


def test_keys_space_and_digits(widget):
    assert not widget.handle_key("3")  # no rating before the answer is shown
    assert widget.handle_key(" ")
    assert widget.answer_shown
    assert widget.handle_key("4")
    assert len(widget.session.store.reviews()) == 1
    assert widget.handle_key("u")
    assert widget.session.store.reviews() == []
    assert not widget.handle_key("x")


def test_done_message_when_nothing_is_due(widget, clock):
    for _ in range(6):
        widget.show_button.click()
        widget.rating_buttons[Rating.Easy].click()
    assert widget.session.current is None
    assert (
        "Nothing due now" in widget.question.value
        and "next card is due in" in widget.question.value
    )
    assert not visible(widget.show_button) and not visible(widget.ratings_box)
    clock[0] += timedelta(days=60)
    widget.session.refresh()
    widget._render()
    assert "Review 6" in widget.progress.value


def test_leech_message(widget, clock):
    card = widget.session.current
    widget.handle_key(" ")
    widget.handle_key("4")
    for _ in range(20):
        clock[0] = widget.session.store.card_state(card.card_id).card.due
        widget.session.refresh()
        widget._render()
        widget.handle_key(" ")
        widget.handle_key("1" if widget.session.state_of(card).card.state == State.Review else "3")
        if "leech" in widget.message.value:
            break
    assert "leech (8 lapses)" in widget.message.value
    assert widget.session.store.card_state(card.card_id).suspended


def test_keyboard_through_ipyevents_when_installed(widget, monkeypatch):
    created = []

    class FakeEvent:  # stands in for ipyevents.Event: records the wiring
        def __init__(self, source, watched_events, prevent_default_action):
            self.source, self.watched = source, watched_events
            self.handlers = []
            created.append(self)

        def on_dom_event(self, handler):
            self.handlers.append(handler)

    monkeypatch.setitem(sys.modules, "ipyevents", types.SimpleNamespace(Event=FakeEvent))
    keyed = DrillWidget(widget.session, keyboard=True)
    (event,) = created
    assert event.source is keyed and event.watched == ["keydown"]
    event.handlers[0]({"type": "keydown", "key": " "})
    assert keyed.answer_shown


def test_no_keyboard_hook_without_ipyevents(widget, monkeypatch):
    monkeypatch.setitem(sys.modules, "ipyevents", None)  # import fails
    assert DrillWidget(widget.session, keyboard=True).key_events is None


def test_drill_entry_point_is_lazy_and_uses_the_env_store(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_FLASHCARDS_DB", str(tmp_path / "env.db"))
    w = flashcards.drill(notebook="06-zero-and-fsdp", deck=TEST_DECK, clock=lambda: START)
    assert isinstance(w, DrillWidget)
    assert [c.slug for c in w.session.cards] == ["words-zero"]
    assert w.session.store.path == tmp_path / "env.db"
    with pytest.raises(AttributeError):
        flashcards.not_a_name  # noqa: B018


def click_on_another_thread(button) -> None:
    """Click as JupyterLab 4 with ipykernel 7 does (comms over subshells): from a thread
    that is not the one that built the widget and its store."""
    errors = []

    def click():
        try:
            button.click()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=click)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def test_buttons_work_from_another_thread(widget):
    first = widget.session.current
    click_on_another_thread(widget.show_button)
    click_on_another_thread(widget.rating_buttons[Rating.Good])
    assert widget.message.value == ""  # no error shown
    assert [r.card_id for r in widget.session.store.reviews()] == [first.card_id]
    assert "reviewed today: 1" in widget.progress.value
    click_on_another_thread(widget.undo_button)
    assert widget.session.store.reviews() == []


def test_an_error_in_a_callback_is_shown_in_the_widget(widget, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk is full")

    widget.show_button.click()
    monkeypatch.setattr(widget.session, "rate", broken)
    widget.rating_buttons[Rating.Good].click()
    assert "RuntimeError: disk is full" in widget.message.value
    assert "went wrong" in widget.message.value
    assert widget.session.store.reviews() == []
