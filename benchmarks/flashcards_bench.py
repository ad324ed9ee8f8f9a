"""Flashcards timing: deck load + today's queue with a long history, and the review round trip.

    python benchmarks/flashcards_bench.py [--reviews 10000] [--rounds 200]

Bars (issue 6): loading the deck and building today's queue < 100 ms with 10,000 reviews in
the log; a review round trip (rate -> persisted -> next card with its button labels) < 20 ms.

The history is simulated with the fsrs scheduler (one year of daily reviews of the course
deck, 90% Good / 10% Again) and imported in one transaction, as ``import-json`` would.
Timings are wall-clock medians and maxima over repeats, on the machine it runs on.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fsrs import Rating

from flashcards.model import default_deck_dir, load_deck
from flashcards.scheduler import NEW, make_scheduler, new_fsrs_card
from flashcards.session import DrillSession
from flashcards.store import Review, Store

START = datetime(2025, 1, 1, 9, 0, tzinfo=UTC)


def simulate_history(deck, n_reviews: int, seed: int = 0) -> tuple[list[Review], datetime]:
    """Reviews of every card, day by day, until ``n_reviews``; returns them and the last day."""
    rng = random.Random(seed)
    scheduler = make_scheduler()
    cards = {c.card_id: (c, None) for c in deck}
    reviews: list[Review] = []
    day = START
    while len(reviews) < n_reviews:
        for card_id, (card, state) in list(cards.items()):
            if len(reviews) >= n_reviews:
                break
            if state is not None and state.due > day:
                continue
            now = day + timedelta(seconds=len(reviews) % 3600)
            base = state if state is not None else new_fsrs_card(card_id, now)
            rating = Rating.Again if rng.random() < 0.1 else Rating.Good
            after, _ = scheduler.review_card(base, rating, review_datetime=now)
            before = NEW if state is None else int(state.state)
            reviews.append(Review(0, card_id, card.slug, rating, now, 5000, before, after, False))
            cards[card_id] = (card, after)
        day += timedelta(days=1)
    return reviews, day


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def cold_start_ms(deck_dir: Path, db: Path) -> float:
    """A fresh interpreter: imports + deck + queue (what `flashcards drill` pays at start)."""
    code = (
        "import time; t=time.perf_counter();"
        "from flashcards.session import DrillSession;"
        f"s=DrillSession({str(deck_dir)!r}, {str(db)!r}); s.labels() if s.current else None;"
        "print((time.perf_counter()-t)*1000)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--deck", default=str(default_deck_dir()))
    args = parser.parse_args()

    deck = load_deck(args.deck)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        reviews, today = simulate_history(deck, args.reviews)
        store = Store(db)
        store.add_reviews(reviews)
        logged = len(store.reviews())
        # The day on which `rounds` cards are due: a large queue, as after a break.
        dues = sorted(state.card.due for state in store.card_states().values())
        clock = [max(today, dues[min(args.rounds, len(dues)) - 1]) + timedelta(days=1)]

        def open_and_queue():
            s = DrillSession(args.deck, db, clock=lambda: clock[0])
            s.store.close()

        load = timed(lambda: load_deck(args.deck), 20)
        startup = timed(open_and_queue, 20)
        session = DrillSession(deck, store, clock=lambda: clock[0], new_per_day=10_000)
        due = session.counts

        def round_trip():
            session.labels()  # what the UI shows for the current card
            session.rate(Rating.Good if random.random() < 0.9 else Rating.Again)
            clock[0] += timedelta(seconds=20)
            if session.current is not None:
                session.labels()  # the next card is ready to show, with its button labels

        trips = timed(round_trip, min(args.rounds, due.total))
        cold = statistics.median(cold_start_ms(Path(args.deck), db) for _ in range(3))

    rows = [
        ("deck load (YAML + validation)", load, None),
        ("deck load + open store + today's queue", startup, 100.0),
        ("review round trip (rate -> commit -> next card)", trips, 20.0),
    ]
    print(
        f"flashcards benchmark: {len(deck)} cards, {logged} reviews in the log, "
        f"queue today: {due.new} new / {due.learning} learning / {due.review} review, "
        f"journal {store.journal_mode}, synchronous=FULL"
    )
    print(f"{'measurement':50} {'median ms':>10} {'max ms':>9} {'bar ms':>7}  runs")
    for name, values, bar in rows:
        med = statistics.median(values)
        verdict = "" if bar is None else ("  ok" if med < bar else "  OVER")
        print(f"{name:50} {med:10.2f} {max(values):9.2f} {bar or '':>7}  {len(values)}{verdict}")
    print(f"{'cold start in a new process (imports included)':50} {cold:10.2f} {'':>9} {'':>7}  3")


if __name__ == "__main__":
    main()
