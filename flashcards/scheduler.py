"""Today's queue on top of FSRS: new-card limit, learning/review order, leeches, intervals.

The memory model and the next due date come from the ``fsrs`` package (FSRS-6, Ye et al.,
https://github.com/open-spaced-repetition/fsrs4anki/wiki/The-Algorithm). What Anki adds
around its scheduler is here, with Anki's defaults (Anki manual, "Deck Options"):

- new cards per day: 20; a card counts as new until its first review;
- a study day starts at 4:00 local time ("next day starts at");
- learning cards due within 20 minutes may be shown early ("learn ahead limit");
- a lapse is an Again on a card in the Review state; at 8 lapses the card is a leech
  (tagged and suspended), and again every 4 lapses after that (half the threshold).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import fsrs
from fsrs import Rating, State

from flashcards.model import Card

NEW_PER_DAY = 20
LEECH_THRESHOLD = 8
LEARN_AHEAD = timedelta(minutes=20)
DAY_ROLLOVER_HOUR = 4
DEFAULT_RETENTION = 0.9
NEW = 0  # "state before" of a first review; FSRS itself models a new card as Learning step 0

RATING_KEYS = {"1": Rating.Again, "2": Rating.Hard, "3": Rating.Good, "4": Rating.Easy}


@dataclass(frozen=True)
class StoredCard:
    """A card's review state as the store caches it (derived from its review log)."""

    card_id: int
    slug: str
    card: fsrs.Card
    reps: int
    lapses: int
    suspended: bool
    leech: bool
    last_review_id: int | None


@dataclass(frozen=True)
class Outcome:
    """What one rating would do: the card after it and the interval until it is due."""

    rating: Rating
    card: fsrs.Card
    interval: timedelta

    @property
    def label(self) -> str:
        """Button text, e.g. ``"Good · 3d"``."""
        return f"{self.rating.name} · {format_interval(self.interval)}"


@dataclass(frozen=True)
class QueueCounts:
    """Anki's three numbers: new cards left today, learning cards, reviews due today."""

    new: int
    learning: int
    review: int

    @property
    def total(self) -> int:
        return self.new + self.learning + self.review


@dataclass(frozen=True)
class Queue:
    """Cards to show now, in order, and when the next card not yet in it becomes due."""

    cards: tuple[Card, ...]
    counts: QueueCounts
    next_due: datetime | None


def make_scheduler(
    desired_retention: float = DEFAULT_RETENTION, *, enable_fuzzing: bool = True
) -> fsrs.Scheduler:
    """An FSRS scheduler with the default FSRS-6 weights and the given target retention."""
    if isinstance(desired_retention, bool) or not isinstance(desired_retention, int | float):
        raise TypeError(f"desired_retention must be a number, got {desired_retention!r}")
    if not 0.7 <= desired_retention <= 0.99:
        raise ValueError(
            f"desired_retention must be in [0.7, 0.99] (Anki's range), got {desired_retention}"
        )
    return fsrs.Scheduler(desired_retention=float(desired_retention), enable_fuzzing=enable_fuzzing)


def as_utc(moment: datetime) -> datetime:
    """The same instant with ``tzinfo=timezone.utc`` (what fsrs requires); naive is an error."""
    if not isinstance(moment, datetime):
        raise TypeError(f"expected a datetime, got {moment!r}")
    if moment.tzinfo is None:
        raise ValueError(f"datetime {moment!r} is naive; pass a timezone-aware datetime")
    return moment.astimezone(UTC)


def day_window(
    now: datetime, *, tz: timezone | None = None, rollover_hour: int = DAY_ROLLOVER_HOUR
) -> tuple[datetime, datetime]:
    """Start and end (UTC) of the study day holding ``now``; days start at ``rollover_hour``
    in ``tz`` (the machine's local zone when None)."""
    local = as_utc(now).astimezone(tz)
    start = local.replace(hour=rollover_hour, minute=0, second=0, microsecond=0)
    if local < start:
        start -= timedelta(days=1)
    return as_utc(start), as_utc(start + timedelta(days=1))


def build_queue(
    cards: Iterable[Card],
    states: Mapping[int, StoredCard],
    *,
    now: datetime,
    day_end: datetime,
    new_left: int,
) -> Queue:
    """Order today's cards as Anki does: learning cards that are due, reviews due today
    (oldest first), new cards in deck order up to ``new_left``, then learning cards due
    within the learn-ahead limit. Suspended cards never appear."""
    now = as_utc(now)
    learning_now, learning_ahead, review, new = [], [], [], []
    next_due = None
    for card in cards:
        stored = states.get(card.card_id)
        if stored is None:
            new.append(card)
            continue
        if stored.suspended:
            continue
        due = stored.card.due
        if stored.card.state == State.Review:
            if due < day_end:
                review.append((due, card))
                continue
        elif due <= now:
            learning_now.append((due, card))
            continue
        elif due <= now + LEARN_AHEAD:
            learning_ahead.append((due, card))
            continue
        next_due = due if next_due is None else min(next_due, due)
    new = new[: max(0, new_left)]
    ordered = [c for _, c in sorted(learning_now, key=_by_due)]
    ordered += [c for _, c in sorted(review, key=_by_due)]
    ordered += new
    ordered += [c for _, c in sorted(learning_ahead, key=_by_due)]
    counts = QueueCounts(
        new=len(new), learning=len(learning_now) + len(learning_ahead), review=len(review)
    )
    return Queue(cards=tuple(ordered), counts=counts, next_due=next_due)


def _by_due(item: tuple[datetime, Card]) -> datetime:
    return item[0]


def new_fsrs_card(card_id: int, now: datetime) -> fsrs.Card:
    """The FSRS state of a card never reviewed."""
    return fsrs.Card(card_id=card_id, due=as_utc(now))


def preview(scheduler: fsrs.Scheduler, card: fsrs.Card, now: datetime) -> dict[Rating, Outcome]:
    """Ask the scheduler what each rating would give (intervals for the four buttons).

    The drill keeps these outcomes and applies the chosen one, so a button's label is
    exactly what happens even when FSRS fuzzes the interval.
    """
    now = as_utc(now)
    outcomes = {}
    for rating in Rating:
        after, _ = scheduler.review_card(card, rating, review_datetime=now)
        outcomes[rating] = Outcome(rating=rating, card=after, interval=after.due - now)
    return outcomes


def is_lapse(state_before: int, rating: Rating) -> bool:
    """A lapse is forgetting a card that had graduated: Again on a Review-state card."""
    return state_before == State.Review and rating == Rating.Again


def becomes_leech(lapses: int, threshold: int = LEECH_THRESHOLD) -> bool:
    """True on the lapse that makes a card a leech: the threshold, then every half threshold."""
    if lapses < threshold:
        return False
    return (lapses - threshold) % max(1, threshold // 2) == 0


def format_interval(delta: timedelta) -> str:
    """Anki-style short interval: ``<1m``, ``10m``, ``3h``, ``4d``, ``1.5mo``, ``2.1y``."""
    seconds = delta.total_seconds()
    if seconds < 60:
        return "<1m"
    if seconds < 3600:
        return f"{round(seconds / 60)}m"
    if seconds < 86400:
        return f"{round(seconds / 3600)}h"
    days = seconds / 86400
    if days < 30:
        return f"{round(days)}d"
    if days < 365:
        return f"{days / 30:.1f}mo"
    return f"{days / 365:.1f}y"
