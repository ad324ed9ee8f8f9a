"""A drill session: the loop both front ends (widget and terminal) drive.

``session.current`` is the card to show, ``session.outcomes()`` what each rating would
do (for the button labels), ``session.rate(Rating.Good)`` records a review and moves
on, ``session.undo()`` takes back this session's last review. The session reads the
store afresh after every action, so a second drill on the same file is taken into
account.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

import fsrs
from fsrs import Rating

from flashcards.course_order import in_course_order, up_to_notebook
from flashcards.model import Card, Deck, load_deck
from flashcards.scheduler import (
    DEFAULT_RETENTION,
    NEW,
    NEW_PER_DAY,
    Outcome,
    QueueCounts,
    StoredCard,
    as_utc,
    becomes_leech,
    build_queue,
    day_window,
    is_lapse,
    make_scheduler,
    new_fsrs_card,
    preview,
)
from flashcards.store import NewReview, Store


@dataclass(frozen=True)
class ReviewResult:
    """What a rating did: the log row id, the card's new state, and whether it became a leech."""

    review_id: int
    card: Card
    rating: Rating
    state: StoredCard
    became_leech: bool


def _utc_now() -> datetime:
    return datetime.now(UTC)


class DrillSession:
    """Review the cards of a deck (optionally one tag or notebook) against a store.

    Args:
        deck: a :class:`Deck`, a deck folder/file, or None for the packaged deck.
        store: a :class:`Store`, a database path, or None for the default location.
        tag, notebook: only cards with this tag / from this notebook (folder or anchor).
        up_to: only cards of the notebooks done so far, 00 to this one (``"03"`` or
            ``"03-algorithms-and-cost"``).
        new_per_day: daily limit of new cards (Anki's default 20), counted over all drills.
        desired_retention: FSRS target probability of recall (default 0.9).
        clock: returns "now" as an aware datetime (tests pass a fixed clock).
        tz: time zone of the 4 am day boundary (local time when None).
    """

    def __init__(
        self,
        deck: Deck | str | os.PathLike | None = None,
        store: Store | str | os.PathLike | None = None,
        *,
        tag: str | None = None,
        notebook: str | None = None,
        up_to: str | int | None = None,
        new_per_day: int = NEW_PER_DAY,
        desired_retention: float = DEFAULT_RETENTION,
        scheduler: fsrs.Scheduler | None = None,
        clock: Callable[[], datetime] | None = None,
        tz: tzinfo | None = None,
    ) -> None:
        if isinstance(new_per_day, bool) or not isinstance(new_per_day, int) or new_per_day < 0:
            raise ValueError(f"new_per_day must be an integer >= 0, got {new_per_day!r}")
        self.deck = deck if isinstance(deck, Deck) else load_deck(deck)
        self.store = store if isinstance(store, Store) else Store(store)
        cards = self.deck.filter(tag=tag, notebook=notebook)
        if up_to is not None:
            cards = up_to_notebook(cards, up_to)
        # new cards are introduced in this order: notebook, then section (flashcards.course_order)
        self.cards = in_course_order(cards)
        if not self.cards and (tag, notebook, up_to) != (None, None, None):
            raise ValueError(
                f"no card matches tag={tag!r} notebook={notebook!r} up_to={up_to!r}; "
                f"tags in this deck: {', '.join(self.deck.tags)}"
            )
        self.new_per_day = new_per_day
        self.scheduler = scheduler or make_scheduler(desired_retention)
        self.clock = clock or _utc_now
        self.tz = tz
        self._undo: list[tuple[int, Card]] = []
        self._front: int | None = None
        self.refresh()

    def now(self) -> datetime:
        return as_utc(self.clock())

    # -- state ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the store and rebuild today's queue."""
        now = self.now()
        day_start, day_end = day_window(now, tz=self.tz)
        self._states = self.store.card_states()
        new_today = self.store.count_reviews(day_start, new_only=True)
        self.reviewed_today = self.store.count_reviews(day_start)
        queue = build_queue(
            self.cards,
            self._states,
            now=now,
            day_end=day_end,
            new_left=self.new_per_day - new_today,
        )
        cards = list(queue.cards)
        if self._front is not None:  # the card just undone is shown again first
            front = [c for c in cards if c.card_id == self._front]
            cards = front + [c for c in cards if c.card_id != self._front]
            self._front = None
        self.queue = cards
        self.counts: QueueCounts = queue.counts
        self.next_due = queue.next_due
        self._outcomes: tuple[datetime, int | None, dict[Rating, Outcome]] | None = None

    @property
    def current(self) -> Card | None:
        """The card to show now, or None when nothing is due."""
        return self.queue[0] if self.queue else None

    def state_of(self, card: Card) -> StoredCard | None:
        return self._states.get(card.card_id)

    def outcomes(self) -> dict[Rating, Outcome]:
        """What each rating would do to the current card (computed once per card shown)."""
        card = self._require_current()
        if self._outcomes is None:
            now = self.now()
            stored = self._states.get(card.card_id)
            fsrs_card = stored.card if stored else new_fsrs_card(card.card_id, now)
            based_on = stored.last_review_id if stored else None
            self._outcomes = (now, based_on, preview(self.scheduler, fsrs_card, now))
        return self._outcomes[2]

    def labels(self) -> dict[Rating, str]:
        """Button labels such as ``"Good · 3d"``."""
        return {rating: outcome.label for rating, outcome in self.outcomes().items()}

    # -- actions --------------------------------------------------------------------------
    def rate(self, rating: Rating | int, *, duration_ms: int | None = None) -> ReviewResult:
        """Record a rating of the current card (one transaction) and move to the next card."""
        card = self._require_current()
        if isinstance(rating, bool) or rating not in (1, 2, 3, 4):
            raise ValueError(
                f"rating must be 1-4 or a fsrs.Rating (Again/Hard/Good/Easy), got {rating!r}"
            )
        rating = Rating(rating)
        outcomes = self.outcomes()
        shown_at, based_on, _ = self._outcomes  # type: ignore[misc]
        decided: list[bool] = []

        def decide(current: StoredCard | None) -> NewReview:
            now = self.now()  # read under the write lock, so log time order = commit order
            if (current.last_review_id if current else None) == based_on:
                # Apply the previewed outcome, shifted to the moment of rating: FSRS counts
                # elapsed time in whole days, so the memory state is the same, and the
                # interval is the one the button showed.
                after = outcomes[rating].card
                after = _shift(after, now - shown_at)
            else:  # another drill reviewed this card meanwhile: schedule from its state
                base = current.card if current else new_fsrs_card(card.card_id, now)
                after, _ = self.scheduler.review_card(base, rating, review_datetime=now)
            state_before = NEW if current is None else int(current.card.state)
            lapse = is_lapse(state_before, rating)
            lapses = (current.lapses if current else 0) + int(lapse)
            decided.append(lapse and becomes_leech(lapses))
            return NewReview(
                rating=rating,
                reviewed_at=now,
                duration_ms=duration_ms,
                state_before=state_before,
                card_after=after,
                lapse=lapse,
                made_leech=decided[-1],
            )

        review_id, state = self.store.record_review(card.card_id, card.slug, decide)
        self._undo.append((review_id, card))
        self.refresh()
        return ReviewResult(review_id, card, rating, state, became_leech=decided[-1])

    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    def undo(self) -> Card:
        """Take back this session's last review: the card's state is rebuilt from its log
        without that entry, and the card is shown again."""
        if not self._undo:
            raise ValueError("nothing to undo in this session")
        review_id, card = self._undo[-1]
        self.store.undo_review(review_id)
        self._undo.pop()
        self._front = card.card_id
        self.refresh()
        return card

    def _require_current(self) -> Card:
        if self.current is None:
            raise ValueError("no card is due; nothing to review")
        return self.current


def _shift(card: fsrs.Card, delta) -> fsrs.Card:
    shifted = fsrs.Card.from_dict(card.to_dict())
    shifted.due = as_utc(card.due + delta)
    shifted.last_review = as_utc(card.last_review + delta) if card.last_review else None
    return shifted


__all__ = ["DrillSession", "ReviewResult"]
