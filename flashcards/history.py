"""JSON export and import of the whole review history (backup, or moving machines).

The file holds every review-log row (with the FSRS card it produced) and the list of
suspended cards; the cached card states are rebuilt from it on import. Import merges:
rows already present (same card, time and rating) are skipped, so importing twice or
importing into a store that shares some history is safe.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsrs
from fsrs import Rating

from flashcards.model import card_id_for
from flashcards.scheduler import as_utc
from flashcards.store import Review, Store

FORMAT = "distlab-flashcards-history"
VERSION = 1


def history_dict(store: Store) -> dict[str, Any]:
    """The store's history as a JSON-ready dict."""
    states = store.card_states()
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": datetime.now(UTC).isoformat(),
        "reviews": [
            {
                "card_id": r.card_id,
                "slug": r.slug,
                "rating": int(r.rating),
                "reviewed_at": r.reviewed_at.isoformat(),
                "duration_ms": r.duration_ms,
                "state_before": r.state_before,
                "card_after": r.card_after.to_dict(),
                "made_leech": r.made_leech,
            }
            for r in store.reviews()
        ],
        "suspended": sorted(s.slug for s in states.values() if s.suspended),
    }


def export_json(store: Store, path: str | os.PathLike) -> int:
    """Write the history to ``path``; returns the number of reviews written."""
    data = history_dict(store)
    Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return len(data["reviews"])


def import_json(store: Store, path: str | os.PathLike) -> int:
    """Merge a history file into the store; returns the number of new reviews."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    return import_dict(store, data, source=str(path))


def import_dict(store: Store, data: Any, *, source: str = "history") -> int:
    """Merge an exported history dict into the store (one transaction)."""
    if not isinstance(data, dict):
        raise TypeError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ValueError(f"{source}: not a {FORMAT!r} file (field 'format')")
    if data.get("version") != VERSION:
        raise ValueError(
            f"{source}: field 'version' is {data.get('version')!r}; this reader knows {VERSION}"
        )
    rows = data.get("reviews")
    if not isinstance(rows, list):
        raise TypeError(f"{source}: field 'reviews' must be a list")
    reviews = [_parse_review(row, f"{source}: reviews[{i}]") for i, row in enumerate(rows)]
    suspended = data.get("suspended", [])
    if not isinstance(suspended, list) or not all(isinstance(s, str) for s in suspended):
        raise TypeError(f"{source}: field 'suspended' must be a list of card slugs")
    return store.add_reviews(reviews, suspended=[card_id_for(s) for s in suspended])


def _parse_review(row: Any, where: str) -> Review:
    if not isinstance(row, dict):
        raise TypeError(f"{where}: expected an object, got {type(row).__name__}")
    try:
        slug = row["slug"]
        card_id = int(row["card_id"])
        if card_id != card_id_for(slug):
            raise ValueError(
                f"card_id {card_id} is not the id of slug {slug!r} ({card_id_for(slug)})"
            )
        rating = Rating(int(row["rating"]))
        state_before = int(row["state_before"])
        if state_before not in (0, 1, 2, 3):
            raise ValueError(f"state_before {state_before} is not 0 (new), 1, 2 or 3")
        card_after = fsrs.Card.from_dict(row["card_after"])
        card_after.due = as_utc(card_after.due)
        if card_after.last_review is not None:
            card_after.last_review = as_utc(card_after.last_review)
        if card_after.card_id != card_id:
            raise ValueError(f"card_after.card_id {card_after.card_id} != card_id {card_id}")
        duration = row.get("duration_ms")
        return Review(
            id=0,
            card_id=card_id,
            slug=slug,
            rating=rating,
            reviewed_at=as_utc(datetime.fromisoformat(row["reviewed_at"])),
            duration_ms=None if duration is None else int(duration),
            state_before=state_before,
            card_after=card_after,
            made_leech=bool(row.get("made_leech", False)),
        )
    except KeyError as exc:
        raise ValueError(f"{where}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
