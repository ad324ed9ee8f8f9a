"""Statistics of a deck's review history: card counts, due forecast, reviews per day, retention.

Retention is Anki's "true retention": among reviews of cards in the Review state (not
learning steps), the share not rated Again. With FSRS it should sit near the desired
retention (0.9 by default); much lower means the intervals are too long for you.
Days are study days (they start at 4:00 local time, as in the queue).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path

from fsrs import Rating, State

from flashcards.model import Card
from flashcards.scheduler import DAY_ROLLOVER_HOUR, as_utc
from flashcards.store import Store


@dataclass(frozen=True)
class DeckStats:
    """Counts and per-day series for a set of cards."""

    cards: int
    new: int
    learning: int
    review: int
    suspended: int
    leeches: int
    due_forecast: list[tuple[date, int]]
    reviews_per_day: list[tuple[date, int]]
    retention: float | None
    retention_reviews: int


def study_day(moment: datetime, tz: tzinfo | None = None) -> date:
    """The study day of an instant (a day starts at 4:00 in ``tz``, local when None)."""
    return (as_utc(moment).astimezone(tz) - timedelta(hours=DAY_ROLLOVER_HOUR)).date()


def compute_stats(
    cards: list[Card], store: Store, *, now: datetime, days: int = 30, tz: tzinfo | None = None
) -> DeckStats:
    """Statistics of ``cards`` (history of cards no longer in the deck is left out)."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    ids = {c.card_id for c in cards}
    states = {k: v for k, v in store.card_states().items() if k in ids}
    today = study_day(now, tz)
    forecast = Counter()
    learning = review = suspended = 0
    for state in states.values():
        if state.suspended:
            suspended += 1
            continue
        if state.card.state == State.Review:
            review += 1
        else:
            learning += 1
        offset = max(0, (study_day(state.card.due, tz) - today).days)
        if offset < days:
            forecast[offset] += 1
    first_day = today - timedelta(days=days - 1)
    since = as_utc(now) - timedelta(days=days + 1)
    per_day = Counter()
    passed = graded = 0
    for r in store.reviews(since=since):
        day = study_day(r.reviewed_at, tz)
        if r.card_id not in ids or day < first_day:
            continue
        per_day[day] += 1
        if r.state_before == State.Review:
            graded += 1
            passed += r.rating != Rating.Again
    return DeckStats(
        cards=len(cards),
        new=len(cards) - len(states),
        learning=learning,
        review=review,
        suspended=suspended,
        leeches=sum(s.leech for s in states.values()),
        due_forecast=[(today + timedelta(days=i), forecast[i]) for i in range(days)],
        reviews_per_day=[
            (first_day + timedelta(days=i), per_day[first_day + timedelta(days=i)])
            for i in range(days)
        ],
        retention=passed / graded if graded else None,
        retention_reviews=graded,
    )


def plot_stats(stats: DeckStats, path: str | os.PathLike) -> Path:
    """Save a two-panel figure (due forecast, reviews per day) to ``path``."""
    from matplotlib.figure import Figure  # no pyplot: leaves the notebook's backend alone
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_due, ax_done = fig.subplots(1, 2)
    ax_due.bar(range(len(stats.due_forecast)), [n for _, n in stats.due_forecast], color="#4878d0")
    ax_due.set(title="Due forecast", xlabel="days from today", ylabel="cards due")
    ax_done.bar(
        range(-len(stats.reviews_per_day) + 1, 1),
        [n for _, n in stats.reviews_per_day],
        color="#6acc64",
    )
    retention = "n/a" if stats.retention is None else f"{stats.retention:.0%}"
    ax_done.set(
        title=f"Reviews per day (true retention {retention}, {stats.retention_reviews} reviews)",
        xlabel="days from today",
        ylabel="reviews",
    )
    for ax in (ax_due, ax_done):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
