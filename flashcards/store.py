"""SQLite store: an append-only review log (the source of truth) and a cache of card states.

Tables::

    reviews(id, card_id, slug, rating, reviewed_at, duration_ms, state_before, card_after, made_leech)
    cards(card_id, slug, card, reps, lapses, suspended, leech, last_review_id)   -- cache

Every review is one ``BEGIN IMMEDIATE`` transaction that reads the card's current state,
appends the log row and updates the cache, so two drills (widget and terminal) on one
file serialise instead of overwriting each other, and a process killed mid-review loses at
most that review (``synchronous=FULL``: a commit is on disk before the call returns).
Each log row keeps the FSRS card it produced, because FSRS fuzzes intervals at random:
the cache is always "the last row's card", and undo deletes the last row and rebuilds
the card from the rows left. Undo is the only deletion.

Threads: one connection, opened with ``check_same_thread=False`` and guarded by a lock
that every read and every transaction holds, so a store built on the notebook's main
thread can be used from the thread that runs widget callbacks (JupyterLab 4's comms over
subshells with ipykernel 7 run them on another thread). Within a process the lock
serialises writes; between processes ``BEGIN IMMEDIATE`` does. SQLite itself is built
"serialized" by Python (https://sqlite.org/threadsafe.html); the lock keeps one thread's
transaction from interleaving with another thread's statements on the shared connection.

A path that is not a SQLite database (or one SQLite cannot open) is a :class:`StoreError`
(a ``ValueError``) naming the file and ``$DISTLAB_FLASHCARDS_DB`` and saying what to do; the
file is left as it is, never deleted or overwritten.

Journal: WAL (readers never block the writer) where the file system supports it; on
network file systems (NFS/SMB home directories on JupyterHub), or when SQLite refuses
WAL, it falls back to a rollback journal (``DELETE``). See https://sqlite.org/wal.html
("WAL does not work over a network filesystem").
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Self

import fsrs
import platformdirs
from fsrs import Rating

from flashcards.scheduler import StoredCard, as_utc, is_lapse

DB_ENV_VAR = "DISTLAB_FLASHCARDS_DB"
JOURNAL_ENV_VAR = "DISTLAB_FLASHCARDS_JOURNAL"
JOURNAL_MODES = ("auto", "wal", "delete", "truncate")
NETWORK_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "fuse.sshfs",
    "afs",
    "lustre",
    "gpfs",
}
SCHEMA_VERSION = 1
_VFS: str | None = None  # SQLite VFS name; tests set "unix-dotfile" to get a VFS without WAL

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS reviews (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    card_id INTEGER NOT NULL,
    slug TEXT NOT NULL,
    rating INTEGER NOT NULL CHECK (rating BETWEEN 1 AND 4),
    reviewed_at TEXT NOT NULL,
    duration_ms INTEGER,
    state_before INTEGER NOT NULL CHECK (state_before BETWEEN 0 AND 3),
    card_after TEXT NOT NULL,
    made_leech INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS reviews_by_card ON reviews (card_id, reviewed_at, id);
CREATE INDEX IF NOT EXISTS reviews_by_time ON reviews (reviewed_at);
CREATE TABLE IF NOT EXISTS cards (
    card_id INTEGER PRIMARY KEY,
    slug TEXT NOT NULL,
    card TEXT NOT NULL,
    reps INTEGER NOT NULL,
    lapses INTEGER NOT NULL,
    suspended INTEGER NOT NULL DEFAULT 0,
    leech INTEGER NOT NULL DEFAULT 0,
    last_review_id INTEGER
);
"""


class StoreError(ValueError):
    """A review store that cannot be opened: the message names the file, where its path came
    from and what to do."""


@dataclass(frozen=True)
class Review:
    """One row of the review log."""

    id: int
    card_id: int
    slug: str
    rating: Rating
    reviewed_at: datetime
    duration_ms: int | None
    state_before: int
    card_after: fsrs.Card
    made_leech: bool


@dataclass(frozen=True)
class NewReview:
    """What a review appends; ``lapse`` tells the store to count a lapse."""

    rating: Rating
    reviewed_at: datetime
    duration_ms: int | None
    state_before: int
    card_after: fsrs.Card
    lapse: bool
    made_leech: bool


def default_db_path() -> Path:
    """``$DISTLAB_FLASHCARDS_DB``, else ``flashcards.sqlite3`` in the user data directory."""
    override = os.environ.get(DB_ENV_VAR)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("distlab")) / "flashcards.sqlite3"


def filesystem_type(path: Path) -> str | None:
    """The file system type of ``path`` from /proc/self/mounts (Linux), else None."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best, kind = "", None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, parts[2]
    return kind


_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _open_error(path: Path, exc: sqlite3.DatabaseError, *, given: bool) -> str:
    """What :class:`StoreError` says: the file, where its path came from, SQLite's words
    and what to do (the file itself is never touched)."""
    if given:
        origin = "given with --db (or as Store's path)"
    elif os.environ.get(DB_ENV_VAR):
        origin = f"set by ${DB_ENV_VAR}"
    else:
        origin = "the default location"
    code = getattr(exc, "sqlite_errorcode", None)
    if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        what = f"is not a SQLite database (SQLite: {exc})"
    else:
        what = f"cannot be opened as a SQLite database (SQLite: {exc})"
    return (
        f"review store {path}, {origin}, {what}; the file was left as it is: move it away, "
        f"or point ${DB_ENV_VAR} (or --db) at another file, which is created if missing"
    )


def _iso(moment: datetime) -> str:
    return as_utc(moment).isoformat(timespec="microseconds")


def _card_json(card: fsrs.Card) -> str:
    return json.dumps(card.to_dict(), separators=(",", ":"))


def _card_from_json(text: str) -> fsrs.Card:
    card = fsrs.Card.from_dict(json.loads(text))
    card.due = as_utc(card.due)
    if card.last_review is not None:
        card.last_review = as_utc(card.last_review)
    return card


class Store:
    """The review database: safe to use from any thread, and to share a file between processes."""

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        journal_mode: str | None = None,
        busy_timeout_ms: int = 10_000,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        requested = (journal_mode or os.environ.get(JOURNAL_ENV_VAR) or "auto").lower()
        if requested not in JOURNAL_MODES:
            raise ValueError(f"journal_mode {requested!r} is not one of {JOURNAL_MODES}")
        if busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        uri = f"{self.path.resolve().as_uri()}" + (f"?vfs={_VFS}" if _VFS else "")
        self._lock = threading.RLock()  # held by every use of the connection (see the docstring)
        try:
            self._conn = sqlite3.connect(
                uri,
                uri=True,
                timeout=busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.DatabaseError as exc:
            raise StoreError(_open_error(self.path, exc, given=path is not None)) from None
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self.journal_mode = self._set_journal_mode(requested)
            self._conn.execute("PRAGMA synchronous = FULL")
            with self.transaction():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            if getattr(exc, "sqlite_errorcode", None) in _BUSY:
                raise  # another process holds the file: not a bad path
            raise StoreError(_open_error(self.path, exc, given=path is not None)) from None

    # -- connection ---------------------------------------------------------------------
    def _set_journal_mode(self, requested: str) -> str:
        if requested in ("auto", "wal"):
            network = filesystem_type(self.path.parent) in NETWORK_FILESYSTEMS
            if requested == "wal" or not network:
                try:
                    mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                except sqlite3.OperationalError:
                    mode = None
                if mode == "wal":
                    return "wal"
            requested = "delete"
        return self._conn.execute(f"PRAGMA journal_mode = {requested.upper()}").fetchone()[0]

    def transaction(self) -> _Transaction:
        """``with store.transaction():`` runs a ``BEGIN IMMEDIATE`` ... ``COMMIT`` block."""
        return _Transaction(self._conn, self._lock)

    def _query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """All rows of one read, under the connection lock (from any thread)."""
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def integrity_check(self) -> str:
        return self._query("PRAGMA integrity_check")[0][0]

    # -- reading ------------------------------------------------------------------------
    def card_states(self) -> dict[int, StoredCard]:
        """Cached state of every reviewed card, by integer id."""
        rows = self._query(
            "SELECT card_id, slug, card, reps, lapses, suspended, leech, last_review_id FROM cards"
        )
        return {row[0]: _stored(row) for row in rows}

    def card_state(self, card_id: int) -> StoredCard | None:
        rows = self._query(
            "SELECT card_id, slug, card, reps, lapses, suspended, leech, last_review_id FROM cards "
            "WHERE card_id = ?",
            (card_id,),
        )
        return _stored(rows[0]) if rows else None

    def reviews(self, *, card_id: int | None = None, since: datetime | None = None) -> list[Review]:
        """Log rows in time order, optionally for one card and/or from ``since`` on."""
        query, args = "SELECT * FROM reviews WHERE 1=1", []
        if card_id is not None:
            query += " AND card_id = ?"
            args.append(card_id)
        if since is not None:
            query += " AND reviewed_at >= ?"
            args.append(_iso(since))
        rows = self._query(query + " ORDER BY reviewed_at, id", args)
        return [_review(row) for row in rows]

    def count_reviews(self, since: datetime, *, new_only: bool = False) -> int:
        """Reviews from ``since`` on; ``new_only`` counts first reviews (new cards studied)."""
        query = "SELECT COUNT(*) FROM reviews WHERE reviewed_at >= ?"
        if new_only:
            query += " AND state_before = 0"
        return self._query(query, (_iso(since),))[0][0]

    # -- writing ------------------------------------------------------------------------
    def record_review(
        self, card_id: int, slug: str, decide: Callable[[StoredCard | None], NewReview]
    ) -> tuple[int, StoredCard]:
        """Append one review atomically; returns ``(review id, new cached state)``.

        ``decide`` gets the card's state as committed by anyone (read inside the write
        lock) and returns the review to record, so concurrent drills never lose a review.
        """
        with self.transaction():
            current = self.card_state(card_id)
            new = decide(current)
            cursor = self._conn.execute(
                "INSERT INTO reviews (card_id, slug, rating, reviewed_at, duration_ms, state_before,"
                " card_after, made_leech) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    card_id,
                    slug,
                    int(new.rating),
                    _iso(new.reviewed_at),
                    new.duration_ms,
                    int(new.state_before),
                    _card_json(new.card_after),
                    int(new.made_leech),
                ),
            )
            review_id = cursor.lastrowid
            reps = (current.reps if current else 0) + 1
            lapses = (current.lapses if current else 0) + int(new.lapse)
            suspended = (current.suspended if current else False) or new.made_leech
            leech = (current.leech if current else False) or new.made_leech
            state = StoredCard(
                card_id, slug, new.card_after, reps, lapses, suspended, leech, review_id
            )
            self._write_cache(state)
        return review_id, state

    def undo_review(self, review_id: int) -> StoredCard | None:
        """Delete review ``review_id`` if it is still its card's latest, and rebuild the
        card from its remaining log. Returns the rebuilt state (None: the card is new again)."""
        with self.transaction():
            row = self._conn.execute("SELECT * FROM reviews WHERE id = ?", (review_id,)).fetchone()
            if row is None:
                raise ValueError(f"review {review_id} is not in the log (already undone?)")
            review = _review(row)
            latest = self._conn.execute(
                "SELECT id FROM reviews WHERE card_id = ? ORDER BY reviewed_at DESC, id DESC LIMIT 1",
                (review.card_id,),
            ).fetchone()[0]
            if latest != review_id:
                raise ValueError(
                    f"cannot undo review {review_id} of {review.slug!r}: the card was reviewed again "
                    f"since (review {latest}), maybe in another drill"
                )
            suspended_before = self.card_state(review.card_id)
            self._conn.execute("DELETE FROM reviews WHERE id = ?", (review_id,))
            keep_suspended = bool(
                suspended_before and suspended_before.suspended and not review.made_leech
            )
            return self._rebuild(review.card_id, review.slug, suspended=keep_suspended)

    def set_suspended(self, card_id: int, suspended: bool) -> None:
        """Suspend or unsuspend a reviewed card (a leech stays tagged as leech)."""
        with self.transaction():
            cursor = self._conn.execute(
                "UPDATE cards SET suspended = ? WHERE card_id = ?", (int(suspended), card_id)
            )
            if cursor.rowcount == 0:
                raise ValueError(
                    f"card {card_id} has no review history; only reviewed cards can be suspended"
                )

    def add_reviews(self, reviews: Iterable[Review], suspended: Iterable[int] = ()) -> int:
        """Merge log rows from an export (skipping ones already present) and rebuild the
        cache of every card touched. Returns the number of rows added. One transaction."""
        added, touched = 0, {}
        with self.transaction():
            for review in reviews:
                iso = _iso(review.reviewed_at)
                exists = self._conn.execute(
                    "SELECT 1 FROM reviews WHERE card_id = ? AND reviewed_at = ? AND rating = ?",
                    (review.card_id, iso, int(review.rating)),
                ).fetchone()
                touched[review.card_id] = review.slug
                if exists:
                    continue
                self._conn.execute(
                    "INSERT INTO reviews (card_id, slug, rating, reviewed_at, duration_ms, state_before,"
                    " card_after, made_leech) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        review.card_id,
                        review.slug,
                        int(review.rating),
                        iso,
                        review.duration_ms,
                        review.state_before,
                        _card_json(review.card_after),
                        int(review.made_leech),
                    ),
                )
                added += 1
            suspended = set(suspended)
            for card_id, slug in touched.items():
                current = self.card_state(card_id)
                keep = card_id in suspended or bool(current and current.suspended)
                self._rebuild(card_id, slug, suspended=keep)
        return added

    def _rebuild(self, card_id: int, slug: str, *, suspended: bool) -> StoredCard | None:
        """Recompute a card's cache from its log: the last row's card, counts, leech flag."""
        reviews = self.reviews(card_id=card_id)
        if not reviews:
            self._conn.execute("DELETE FROM cards WHERE card_id = ?", (card_id,))
            return None
        last = reviews[-1]
        state = StoredCard(
            card_id=card_id,
            slug=last.slug or slug,
            card=last.card_after,
            reps=len(reviews),
            lapses=sum(is_lapse(r.state_before, r.rating) for r in reviews),
            suspended=suspended,
            leech=any(r.made_leech for r in reviews),
            last_review_id=last.id,
        )
        self._write_cache(state)
        return state

    def _write_cache(self, state: StoredCard) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO cards (card_id, slug, card, reps, lapses, suspended, leech,"
            " last_review_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                state.card_id,
                state.slug,
                _card_json(state.card),
                state.reps,
                state.lapses,
                int(state.suspended),
                int(state.leech),
                state.last_review_id,
            ),
        )


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error), holding the store's lock."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.RLock) -> None:
        self._conn, self._lock = conn, lock

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        return self._conn

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._conn.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self._lock.release()


def _stored(row: tuple) -> StoredCard:
    card_id, slug, card, reps, lapses, suspended, leech, last_review_id = row
    return StoredCard(
        card_id,
        slug,
        _card_from_json(card),
        reps,
        lapses,
        bool(suspended),
        bool(leech),
        last_review_id,
    )


def _review(row: tuple) -> Review:
    rid, card_id, slug, rating, reviewed_at, duration_ms, state_before, card_after, made_leech = row
    return Review(
        id=rid,
        card_id=card_id,
        slug=slug,
        rating=Rating(rating),
        reviewed_at=as_utc(datetime.fromisoformat(reviewed_at)),
        duration_ms=duration_ms,
        state_before=state_before,
        card_after=_card_from_json(card_after),
        made_leech=bool(made_leech),
    )
