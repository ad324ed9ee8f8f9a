"""Fixtures for the real-browser tests: one JupyterLab server and one Chromium per module.

Needs Debian's Chromium (``apt-get install chromium``) and the ``browser`` extra
(``pip install -e ".[browser]"``: Playwright from pip, pointed at that binary; never
``playwright install``). Without them a developer's run skips these tests with the reason;
under CI (``CI`` set) it fails instead, so a CI machine that lost the browser cannot pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from jupyterlab_driver import CHROMIUM, JupyterLabServer, LabPage

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_ENV_VAR = "DISTLAB_BROWSER_ARTIFACTS"


def _missing_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return 'Playwright is not installed: pip install -e ".[browser]"'
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM}: apt-get install chromium (or set DISTLAB_CHROMIUM)"
    return None


@pytest.fixture(scope="session", autouse=True)
def browser_available() -> None:
    """Skip with the reason for a developer without the browser; fail under CI."""
    reason = _missing_browser()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"CI must run the browser tests, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Screenshots go to $DISTLAB_BROWSER_ARTIFACTS, else out/browser/ (git-ignored)."""
    path = Path(os.environ.get(ARTIFACTS_ENV_VAR) or ROOT / "out" / "browser")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lab-root")


@pytest.fixture(scope="module")
def flashcards_db(tmp_path_factory) -> Path:
    """The drill's review store, never the learner's real one."""
    return tmp_path_factory.mktemp("flashcards") / "flashcards.sqlite3"


@pytest.fixture(scope="module")
def server(lab_root, flashcards_db, tmp_path_factory):
    from flashcards.store import DB_ENV_VAR

    base = tmp_path_factory.mktemp("lab-env")
    with JupyterLabServer(lab_root, base, env={DB_ENV_VAR: str(flashcards_db)}) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox"] if os.geteuid() == 0 else [],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def lab(browser, server, artifacts):
    """A fresh JupyterLab tab, 1400x900; the server log is attached to failures."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(120_000)
    lab_page = LabPage(page, server, artifacts)
    lab_page.launch()
    yield lab_page
    # a failed test leaves its kernel (and the kernel's worker processes) running
    page.evaluate("async () => { await window.jupyterapp.serviceManager.sessions.shutdownAll(); }")
    context.close()
