"""The SQLite store: journal modes, two processes at once, a kill mid-write, JSON history."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fsrs import Rating

import flashcards.store as store_module
from flashcards.history import export_json, import_json
from flashcards.scheduler import make_scheduler
from flashcards.session import DrillSession
from flashcards.store import Store, default_db_path, filesystem_type

TEST_DECK = Path(__file__).parent / "data" / "deck"
START = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)

# A drill in another process: rates whatever is first in its queue with Again (which keeps
# cards in the learning queue), printing each committed review id. With a 4th argument it
# waits for a line on stdin first, so two workers start at the same moment, and pauses
# between reviews (SQLite's lock is not fair: a process that never pauses can starve the other).
WORKER = """
import sys
import time
from fsrs import Rating
from flashcards.session import DrillSession
from flashcards.store import Store
db, deck, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
session = DrillSession(deck, Store(db), new_per_day=1000)
together = len(sys.argv) > 4
if together:  # start with the other worker, and pause between reviews as a person does
    print("ready", flush=True)
    sys.stdin.readline()
for _ in range(n):
    session.refresh()
    result = session.rate(Rating.Again)
    print(result.review_id, flush=True)
    if together:
        time.sleep(0.003)
"""


def run_session(db: Path, n: int) -> DrillSession:
    clock_now = [START]
    session = DrillSession(
        TEST_DECK,
        Store(db),
        clock=lambda: clock_now[0],
        tz=UTC,
        scheduler=make_scheduler(enable_fuzzing=False),
    )
    ratings = [Rating.Good, Rating.Easy, Rating.Again, Rating.Hard]
    for i in range(n):
        session.rate(ratings[i % 4])
        clock_now[0] += timedelta(minutes=11)
        session.refresh()
    return session


def assert_log_consistent(store: Store) -> None:
    """The cache equals the log's last card for every card, and each review was based on
    the state the previous one committed (no lost update)."""
    for card_id, state in store.card_states().items():
        rows = store.reviews(card_id=card_id)
        assert state.card.to_dict() == rows[-1].card_after.to_dict()
        assert state.reps == len(rows) and state.last_review_id == rows[-1].id
        assert rows[0].state_before == 0, [
            (r.id, r.reviewed_at.isoformat(), r.state_before) for r in rows[:4]
        ]
        for before, after in itertools.pairwise(rows):
            assert after.state_before == int(before.card_after.state)


def test_wal_durable_settings_by_default(tmp_path):
    store = Store(tmp_path / "r.db")
    if filesystem_type(tmp_path) in store_module.NETWORK_FILESYSTEMS:
        pytest.skip("tmp is on a network file system")
    assert store.journal_mode == "wal"
    conn = store._conn
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
    assert store.integrity_check() == "ok"


def test_falls_back_to_a_rollback_journal_when_sqlite_refuses_wal(tmp_path, monkeypatch):
    # SQLite's "unix-dotfile" VFS has no shared memory, so PRAGMA journal_mode=WAL really
    # fails there, as it can on network home directories.
    monkeypatch.setattr(store_module, "_VFS", "unix-dotfile")
    session = run_session(tmp_path / "r.db", 6)
    assert session.store.journal_mode == "delete"
    assert session.store.integrity_check() == "ok"
    assert len(session.store.reviews()) == 6
    assert not (tmp_path / "r.db-wal").exists()


def test_network_file_systems_skip_wal(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "filesystem_type", lambda path: "nfs4")
    assert Store(tmp_path / "nfs.db").journal_mode == "delete"
    monkeypatch.setenv(store_module.JOURNAL_ENV_VAR, "truncate")
    assert Store(tmp_path / "forced.db").journal_mode == "truncate"
    with pytest.raises(ValueError, match="journal_mode 'fast'"):
        Store(tmp_path / "x.db", journal_mode="fast")


@pytest.mark.skipif(not Path("/proc/self/mounts").exists(), reason="needs Linux /proc")
def test_filesystem_type_reads_the_mount_table():
    assert filesystem_type(Path("/proc/self")) == "proc"


def test_default_location_is_overridable(tmp_path, monkeypatch):
    monkeypatch.delenv(store_module.DB_ENV_VAR, raising=False)
    assert default_db_path().parent.name == "distlab"
    monkeypatch.setenv(store_module.DB_ENV_VAR, str(tmp_path / "mine.db"))
    assert default_db_path() == tmp_path / "mine.db"
    assert Store().path == tmp_path / "mine.db"


def test_threads_share_one_store(tmp_path):
    """A store built on one thread serves others (widget callbacks run off the main thread
    in JupyterLab 4); concurrent reviews of one card serialise without a lost update."""
    store = Store(tmp_path / "r.db")
    errors: list[BaseException] = []

    def review(n: int) -> None:
        session = DrillSession(TEST_DECK, store, new_per_day=1000)
        try:
            for _ in range(n):
                session.refresh()
                session.rate(Rating.Again)
        except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=review, args=(15,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(store.reviews()) == 45
    assert_log_consistent(store)
    assert store.integrity_check() == "ok"


def test_two_processes_reviewing_at_once(tmp_path):
    db = tmp_path / "shared.db"
    Store(db).close()
    n = 60
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db), str(TEST_DECK), str(n), "wait"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [p.communicate(timeout=60) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    first, second = ([int(line) for line in out.split()] for out, _ in outputs)
    assert min(first) < max(second) and min(second) < max(first)  # they really interleaved
    ids = first + second
    store = Store(db)
    assert store.integrity_check() == "ok"
    assert len(ids) == 2 * n and len(set(ids)) == 2 * n
    assert sorted(r.id for r in store.reviews()) == sorted(ids)
    assert_log_consistent(store)


def test_kill_mid_review_loses_at_most_that_review(tmp_path):
    db = tmp_path / "crash.db"
    Store(db).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(db), str(TEST_DECK), "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    committed = []
    try:
        while len(committed) < 40:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            committed.append(int(line))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        # read through proc.stdout, not communicate(): readline() may already hold the next
        # ids in its buffer, and communicate() reads the pipe behind that buffer's back
        out = proc.stdout.read()
        proc.stderr.read()
        proc.wait(timeout=30)
    committed += [int(line) for line in out.split()]
    assert proc.returncode == -signal.SIGKILL
    store = Store(db)
    assert store.integrity_check() == "ok"
    logged = {r.id for r in store.reviews()}
    assert set(committed) <= logged  # every committed review survived
    assert len(logged) - len(committed) in (0, 1)  # at most the in-flight one on top
    assert_log_consistent(store)


def test_json_history_round_trip_and_merge(tmp_path):
    session = run_session(tmp_path / "a.db", 8)
    store = session.store
    store.set_suspended(next(iter(store.card_states())), True)
    path = tmp_path / "history.json"
    assert export_json(store, path) == len(store.reviews()) == 8
    data = json.loads(path.read_text())
    assert data["format"] == "distlab-flashcards-history" and len(data["suspended"]) == 1

    fresh = Store(tmp_path / "b.db")
    assert import_json(fresh, path) == 8
    assert import_json(fresh, path) == 0  # merging the same history again adds nothing
    assert {k: v.card.to_dict() for k, v in fresh.card_states().items()} == {
        k: v.card.to_dict() for k, v in store.card_states().items()
    }
    assert [(r.slug, r.rating, r.reviewed_at) for r in fresh.reviews()] == [
        (r.slug, r.rating, r.reviewed_at) for r in store.reviews()
    ]
    assert sum(s.suspended for s in fresh.card_states().values()) == 1
    assert_log_consistent(fresh)


def test_bad_history_files_are_named(tmp_path):
    store = Store(tmp_path / "r.db")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not JSON"):
        import_json(store, bad)
    bad.write_text(json.dumps({"format": "anki", "version": 1}))
    with pytest.raises(ValueError, match="field 'format'"):
        import_json(store, bad)
    good = {"format": "distlab-flashcards-history", "version": 1, "reviews": [{"slug": "x"}]}
    bad.write_text(json.dumps(good))
    with pytest.raises(ValueError, match=r"reviews\[0\]: missing field 'card_id'"):
        import_json(store, bad)
    assert store.reviews() == []


def test_undo_only_deletes_and_a_foreign_review_cannot_be_undone(tmp_path):
    session = run_session(tmp_path / "r.db", 3)
    with pytest.raises(ValueError, match="not in the log"):
        session.store.undo_review(10_000)
    raw = sqlite3.connect(tmp_path / "r.db")
    assert raw.execute("SELECT COUNT(*) FROM reviews").fetchone()[0] == 3
    raw.close()
