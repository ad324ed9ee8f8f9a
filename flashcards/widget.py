"""The JupyterLab drill: an ipywidgets card with "Show answer" and four rating buttons.

>>> import flashcards
>>> flashcards.drill(up_to="02")   # the notebooks done so far; last in a cell, it shows

Each rating button carries the interval FSRS would give (``Good · 3d``); the labels are
the outcomes the session will apply, so what you click is what you get. Markdown and
math are rendered (``HTMLMath``, MathJax in the notebook).

Keys: plain ipywidgets has no keyboard events. If the ``ipyevents`` package is installed,
1-4 rate, Space shows the answer and ``u`` undoes, while the mouse is over the card (that
is how ipyevents gives a widget the keyboard). Without it, Tab moves between the buttons
and Space/Enter presses the focused one, as for any HTML button.

Errors: ipywidgets swallows an exception raised in a button callback (it lands in
JupyterLab's log console, not in the cell). Every action here is wrapped so that an error
is shown in the widget's message line, with its type and text, and logged.
"""

from __future__ import annotations

import functools
import html
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime, tzinfo

import ipywidgets as widgets
from fsrs import Rating

from flashcards.model import Deck
from flashcards.render import to_html
from flashcards.scheduler import DEFAULT_RETENTION, NEW_PER_DAY, RATING_KEYS, format_interval
from flashcards.session import DrillSession
from flashcards.store import Store

_log = logging.getLogger(__name__)

_BUTTON_STYLES = {
    Rating.Again: "danger",
    Rating.Hard: "warning",
    Rating.Good: "success",
    Rating.Easy: "info",
}


def _shows_errors(action: Callable) -> Callable:
    """Run a widget action; if it raises, show the error in the widget instead of losing it."""

    @functools.wraps(action)
    def guarded(self: DrillWidget, *args, **kwargs):
        try:
            return action(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - shown to the learner, and logged
            _log.exception("flashcards drill: %s failed", action.__name__)
            self.message.value = (
                '<div style="color:#cf222e"><b>Something went wrong</b> '
                f"({html.escape(action.__name__.strip('_').replace('_', ' '))}): "
                f"<code>{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</code>."
                " Your earlier reviews are saved; run the cell again to restart the drill.</div>"
            )
            return None

    return guarded


class DrillWidget(widgets.VBox):
    """A drill UI over a :class:`DrillSession`; its parts are attributes so tests can click them."""

    def __init__(self, session: DrillSession, *, keyboard: bool = True) -> None:
        self.session = session
        self.progress = widgets.HTML()
        self.question = widgets.HTMLMath()
        self.answer = widgets.HTMLMath()
        self.message = widgets.HTML()
        self.show_button = widgets.Button(
            description="Show answer", button_style="primary", tooltip="Space"
        )
        self.show_button.on_click(lambda _: self.show_answer())
        self.rating_buttons: dict[Rating, widgets.Button] = {}
        for rating in Rating:
            button = widgets.Button(
                button_style=_BUTTON_STYLES[rating], tooltip=f"key {int(rating)}"
            )
            button.on_click(lambda _, r=rating: self.rate(r))
            self.rating_buttons[rating] = button
        self.undo_button = widgets.Button(description="Undo", icon="undo", tooltip="key u")
        self.undo_button.on_click(lambda _: self.undo())
        self.ratings_box = widgets.HBox(list(self.rating_buttons.values()))
        super().__init__(
            [
                self.progress,
                self.question,
                self.answer,
                widgets.HBox([self.show_button, self.ratings_box, self.undo_button]),
                self.message,
            ],
            layout=widgets.Layout(max_width="48em", padding="0.5em"),
        )
        self.add_class("distlab-flashcards")
        self.answer_shown = False
        self._shown_at = time.monotonic()
        self.key_events = _attach_keys(self) if keyboard else None
        self._render()

    # -- actions (the buttons and keys call these) ----------------------------------------
    @_shows_errors
    def show_answer(self) -> None:
        if self.session.current is None or self.answer_shown:
            return
        self.answer_shown = True
        self._render()

    @_shows_errors
    def rate(self, rating: Rating | int) -> None:
        if self.session.current is None or not self.answer_shown:
            return
        duration_ms = int((time.monotonic() - self._shown_at) * 1000)
        result = self.session.rate(rating, duration_ms=duration_ms)
        self.message.value = (
            f"<b>{html.escape(result.card.slug)}</b> is a leech ({result.state.lapses} lapses): "
            "tagged and suspended. Rewrite it or study its notebook section "
            f"<code>{html.escape(result.card.notebook)}</code>."
            if result.became_leech
            else ""
        )
        self._next()

    @_shows_errors
    def undo(self) -> None:
        if not self.session.can_undo:
            return
        card = self.session.undo()
        self.message.value = f"Undid the last review of <b>{html.escape(card.slug)}</b>."
        self._next()

    def handle_key(self, key: str) -> bool:
        """Act on a key name as browsers report it; returns True if it did something."""
        if key in (" ", "Spacebar", "Enter") and not self.answer_shown:
            self.show_answer()
            return self.answer_shown
        if key in RATING_KEYS and self.answer_shown:
            self.rate(RATING_KEYS[key])
            return True
        if key in ("u", "U") and self.session.can_undo:
            self.undo()
            return True
        return False

    # -- drawing ----------------------------------------------------------------------------
    def _next(self) -> None:
        self.answer_shown = False
        self._shown_at = time.monotonic()
        self._render()

    def _render(self) -> None:
        s = self.session
        c = s.counts
        self.progress.value = (
            f'<span style="color:#1f6feb">New {c.new}</span> · '
            f'<span style="color:#cf222e">Learning {c.learning}</span> · '
            f'<span style="color:#1a7f37">Review {c.review}</span>'
            f" &nbsp;|&nbsp; reviewed today: {s.reviewed_today}"
        )
        self.undo_button.disabled = not s.can_undo
        card = s.current
        if card is None:
            later = (
                ""
                if s.next_due is None
                else f" The next card is due in {format_interval(s.next_due - s.now())}."
            )
            self.question.value = f"<p><b>Nothing due now.</b>{later}</p>"
            self.answer.value = ""
            self.show_button.layout.display = "none"
            self.ratings_box.layout.display = "none"
            return
        state = s.state_of(card)
        badge = "new" if state is None else state.card.state.name.lower()
        self.question.value = (
            f'<div style="color:#666;font-size:85%">{html.escape(card.notebook)} · {badge}</div>'
            + to_html(card.q)
        )
        if self.answer_shown:
            self.answer.value = "<hr>" + to_html(card.a)
            for rating, label in s.labels().items():
                self.rating_buttons[rating].description = label
            self.show_button.layout.display = "none"
            self.ratings_box.layout.display = ""
        else:
            self.answer.value = ""
            self.show_button.layout.display = ""
            self.ratings_box.layout.display = "none"


def _attach_keys(widget: DrillWidget):
    """Keyboard shortcuts through ipyevents when it is installed; None otherwise."""
    try:
        from ipyevents import Event
    except ImportError:
        return None
    event = Event(source=widget, watched_events=["keydown"], prevent_default_action=True)
    event.on_dom_event(lambda e: widget.handle_key(e.get("key", "")))
    return event


def drill(
    tag: str | None = None,
    notebook: str | None = None,
    *,
    up_to: str | int | None = None,
    new_per_day: int = NEW_PER_DAY,
    desired_retention: float = DEFAULT_RETENTION,
    db: Store | str | os.PathLike | None = None,
    deck: Deck | str | os.PathLike | None = None,
    clock: Callable[[], datetime] | None = None,
    tz: tzinfo | None = None,
    keyboard: bool = True,
) -> DrillWidget:
    """A drill widget over the course deck (or ``deck``), reviewing into the default store
    (or ``db``); filter by ``tag``, ``notebook`` (``"04-data-parallelism"`` or a
    ``"folder#section"`` anchor) or ``up_to`` (``"03"``: notebooks 00 to 03, the ones done
    so far). New cards come in course order. Display it by leaving it last in a cell."""
    session = DrillSession(
        deck,
        db,
        tag=tag,
        notebook=notebook,
        up_to=up_to,
        new_per_day=new_per_day,
        desired_retention=desired_retention,
        clock=clock,
        tz=tz,
    )
    return DrillWidget(session, keyboard=keyboard)
