"""Shared test setup: no test touches the learner's real files.

Every test (and every process it starts, which inherits the environment) gets its own
flashcards review database in a temporary folder through ``$DISTLAB_FLASHCARDS_DB``, so
a test that opens the default store (``flashcards list``, ``flashcards.drill()``) never
creates or changes ``~/.local/share/distlab/flashcards.sqlite3``. A test that wants the
default location back deletes the variable with ``monkeypatch.delenv``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _temporary_flashcards_store(tmp_path_factory, monkeypatch):
    from flashcards.store import DB_ENV_VAR

    store_dir = tmp_path_factory.mktemp("flashcards-store")
    monkeypatch.setenv(DB_ENV_VAR, str(store_dir / "flashcards.sqlite3"))
    return store_dir / "flashcards.sqlite3"
