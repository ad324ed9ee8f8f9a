"""Shared test setup.

**No test touches the learner's real files.** Every test (and every process it starts,
which inherits the environment) gets its own flashcards review database in a temporary
folder through ``$DISTLAB_FLASHCARDS_DB``, so a test that opens the default store
(``flashcards list``, ``flashcards.drill()``) never creates or changes
``~/.local/share/distlab/flashcards.sqlite3``. A test that wants the default location back
deletes the variable with ``monkeypatch.delenv``. The grades and checks that ``distlab
grade`` and ``distlab.check`` record go to a temporary data folder too
(``$DISTLAB_DATA_DIR``), set for the whole session, before any module-scoped fixture grades.

**Two tiers, two workers.** ``tiers`` (in this folder) prints the slowest tests and flags
unmarked ones over the fast tier's budget. Under pytest-xdist (``-n 2 --dist loadfile``, set
in pyproject.toml) each module runs on one worker, so its module-scoped fixtures (such as
the course that nbgrader grades) run once; :func:`pytest_collection_modifyitems` queues the
modules with the most slow tests first, so that the longest start at once and the short
ones fill the gaps. (``--dist loadgroup`` cannot do this here: pytest 9.2 ignores the node
id that xdist 3.8 rewrites for a group.)
"""

from __future__ import annotations

import warnings

import pytest

pytest_plugins = ["tiers", "pytester"]  # pytester: tests/test_tiers.py runs small suites


@pytest.fixture(scope="session", autouse=True)
def _temporary_data_folder(tmp_path_factory):
    from distlab.grading.record import DATA_ENV_VAR

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DATA_ENV_VAR, str(tmp_path_factory.mktemp("distlab-data")))
        yield


@pytest.fixture(autouse=True)
def _temporary_flashcards_store(tmp_path_factory, monkeypatch):
    from flashcards.store import DB_ENV_VAR

    store_dir = tmp_path_factory.mktemp("flashcards-store")
    monkeypatch.setenv(DB_ENV_VAR, str(store_dir / "flashcards.sqlite3"))
    return store_dir / "flashcards.sqlite3"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first: modules by their number of slow tests, most first (the course's
    nbgrader run, then the mutation suite, ...); a module's tests keep their order.
    ``--dist loadfile`` hands out modules in the order their first test appears."""
    slow_count: dict = {}
    for item in items:
        slow_count[item.path] = slow_count.get(item.path, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow_count[item.path])


class SigintChanged(UserWarning):
    """SIGINT's handling in the pytest process changed under a test or fixture."""


@pytest.fixture(autouse=True)
def _ctrl_c_left_as_found():
    """Report (a warning, named) a test that changes how the pytest process takes Ctrl+C:
    a later test that interrupts its own main thread (``distlab.check``'s time limit) or
    starts a Python that should take Ctrl+C (a child inherits an ignored SIGINT) depends on
    it. (A run started as a background job of a non-interactive shell, ``pytest &`` in a
    script, starts with SIGINT ignored, as POSIX says; the tests that need Ctrl+C set it
    themselves, so that is not reported.)"""
    before = _sigint_state()
    yield
    after = _sigint_state()
    if after != before:
        warnings.warn(SigintChanged(f"this test changed SIGINT from {before!r} to {after!r}"))


def _sigint_in_proc() -> tuple[bool, bool] | None:
    """(ignored, blocked in the main thread) for SIGINT as the kernel sees it (a library's C
    code can change either behind Python's signal module), from /proc; None elsewhere."""
    import os

    try:
        with open(f"/proc/self/task/{os.getpid()}/status") as status:
            fields = dict(line.split(":", 1) for line in status if line.startswith("Sig"))
    except OSError:
        return None
    bit = 1 << 1  # SIGINT is signal 2: bit 1 of the masks
    return bool(int(fields["SigIgn"], 16) & bit), bool(int(fields["SigBlk"], 16) & bit)


def _sigint_state():
    import signal

    return signal.getsignal(signal.SIGINT), _sigint_in_proc()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """The guard above for module- and session-scoped fixtures, which set up before it."""
    before = _sigint_state()
    result = yield
    after = _sigint_state()
    if after != before:
        warnings.warn(SigintChanged(
            f"fixture {fixturedef.argname!r} changed SIGINT from {before!r} to {after!r}"
        ))  # fmt: skip
    return result
