"""The course site as a reader meets it: every page opened in Chromium, offline.

A local HTTP server serves a built site (``distlab site build``); every request to another
host is refused, so the site must work with no network. Every page is opened, and on each:
no console error, every image loaded, the math typeset by MathJax (no ``$...$`` left in the
prose); then every link inside the site leads to a file, and its anchor to an element of that
page, and so does every flashcard's ``notebook#section`` and every section the grader names
("reread the notebook's section #..."). Search finds "ring all-reduce" and "bubble".

The site under test is ``$DISTLAB_SITE_DIR`` (a built ``html`` folder: CI builds it with the
README's command after the suite). Otherwise the module builds one in a temporary folder
from the executed notebooks the course tests keep (``.pytest_cache/d/executed-notebooks``),
and skips (fails under CI) where they have not run: it never runs the course itself.
Screenshots of the landing page, a notebook page with a figure and a search go to the
browser artifacts folder (``out/browser/`` or ``$DISTLAB_BROWSER_ARTIFACTS``).
"""

from __future__ import annotations

import functools
import html
import http.server
import os
import re
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest

from distlab import grading
from distlab.site import build, executed
from flashcards.model import load_deck

pytestmark = [pytest.mark.slow, pytest.mark.site, pytest.mark.timeout(900)]

ROOT = grading.find_course_root()
SITE_ENV_VAR = "DISTLAB_SITE_DIR"
MATH_DONE_JS = """async () => {
    if (!window.MathJax || !window.MathJax.startup) return false;
    await window.MathJax.startup.promise;  // resolves when the page's math is typeset
    return true;
}"""
PAGE_FACTS_JS = """() => {
    const inside = (el, sel) => el.closest(sel) !== null;
    const prose = Array.from(document.querySelectorAll(
        'article p, article li, article td, article th, article dd, article dt, article h1, '
        + 'article h2, article h3, article h4'))
        .filter(el => !inside(el, 'pre, code, .cell_output, .output, .highlight'))
        .map(el => el.innerText);
    return {
        ids: Array.from(document.querySelectorAll('[id]')).map(el => el.id),
        links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
        brokenImages: Array.from(document.images)
            .filter(img => !img.complete || img.naturalWidth === 0).map(img => img.src),
        images: document.images.length,
        mathSources: document.querySelectorAll('span.math, div.math').length,
        typeset: document.querySelectorAll('mjx-container').length,
        prose: prose,
    };
}"""
RAW_MATH = re.compile(r"\$[^$\s][^$]*\$|\\\(|\\\[")


def _missing_site_tools() -> str | None:
    try:
        import myst_nb  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError:
        return 'the site build is not installed: pip install -e ".[site]"'
    return None


@pytest.fixture(scope="module")
def site_html(tmp_path_factory) -> Path:
    """The built site: ``$DISTLAB_SITE_DIR``, or one built now from the test run's outputs."""
    if os.environ.get(SITE_ENV_VAR):
        folder = Path(os.environ[SITE_ENV_VAR])
        assert (folder / "index.html").is_file(), f"${SITE_ENV_VAR}={folder} holds no index.html"
        return folder
    folders = executed.default_folders(ROOT)
    missing = [a for a in grading.assignment_names(ROOT) if not executed.find(ROOT, a, folders)]
    reason = _missing_site_tools() or (
        f"no executed copies of {', '.join(missing)}: run the course tests first "
        "(python -m pytest tests/test_course.py), or set $DISTLAB_SITE_DIR to a built site"
        if missing
        else None
    )
    if reason:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"CI must test the site, but {reason}", pytrace=False)
        pytest.skip(reason)
    with warnings.catch_warnings():  # myst-parser's and the book theme's use of Sphinx 9's
        warnings.simplefilter("ignore")  # deprecated ``.app`` (some 450 RemovedInSphinx11)
        report = build.build(tmp_path_factory.mktemp("site"), run_missing=False)
    print(report.summary())
    return report.html


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test reports what matters
        pass


@pytest.fixture(scope="module")
def site_url(site_html):
    """The site served on 127.0.0.1 (a free port) for the module."""
    handler = functools.partial(_Quiet, directory=str(site_html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@dataclass
class Reader:
    """A browser tab that can reach only the site, with what it was refused (requests to
    other hosts) and every console error, each with the page it came from."""

    page: object
    refused: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def reader(browser, site_url):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    tab = Reader(page)

    def only_the_site(route):
        if route.request.url.startswith(site_url):
            route.continue_()
        else:
            tab.refused.append(f"{page.url} -> {route.request.url}")
            route.abort()

    def console(message):
        if message.type == "error":
            tab.errors.append(f"{page.url}: {message.text}")

    context.route("**/*", only_the_site)
    page.on("console", console)
    page.on("pageerror", lambda error: tab.errors.append(f"{page.url}: {error}"))
    yield tab
    context.close()


def _pages(html: Path) -> list[str]:
    return sorted(
        p.relative_to(html).as_posix()
        for p in html.rglob("*.html")
        if not p.relative_to(html).parts[0].startswith("_")
    )


@pytest.fixture(scope="module")
def visited(reader, site_html, site_url) -> dict[str, dict]:
    """Open every page once; page path -> what it shows (ids, links, images, math, prose)."""
    facts = {}
    for path in _pages(site_html):
        reader.page.goto(site_url + path, wait_until="load")
        reader.page.evaluate(MATH_DONE_JS)
        facts[path] = reader.page.evaluate(PAGE_FACTS_JS)
    return facts


def test_every_page_opens_offline_without_errors(reader, visited, site_html):
    assert len(visited) >= 14 + 14 + 10, sorted(visited)
    assert not reader.refused, "requests that left the site:\n" + "\n".join(reader.refused)
    assert not reader.errors, "console errors:\n" + "\n".join(reader.errors)
    broken = {p: f["brokenImages"] for p, f in visited.items() if f["brokenImages"]}
    assert not broken, f"images that did not load: {broken}"
    figures = sum(f["images"] for p, f in visited.items() if p.startswith("notebooks/"))
    assert figures >= 20, f"only {figures} figures on the notebook pages"


def test_math_is_typeset_everywhere(visited):
    untypeset = [p for p, f in visited.items() if f["mathSources"] and not f["typeset"]]
    assert not untypeset, f"pages with math that MathJax did not typeset: {untypeset}"
    raw = {  # the library pages are docstrings: their "$...$" names the deck's syntax
        p: hits
        for p, f in visited.items()
        if not p.startswith("library/")
        and (hits := [m for text in f["prose"] for m in RAW_MATH.findall(text)])
    }
    assert not raw, f"math left as source text: {raw}"
    assert sum(f["typeset"] for f in visited.values()) > 100


def _target(url: str, site_url: str) -> tuple[str, str] | None:
    """(page path, fragment) of a link inside the site, or None for one leaving it."""
    if not url.startswith(site_url):
        return None
    parsed = urlparse(url)
    path = unquote(parsed.path).lstrip("/")
    return (path or "index.html"), unquote(parsed.fragment)


def _dangling(targets, visited, site_html) -> list[str]:
    bad = []
    for where, path, fragment in targets:
        if path.endswith("/"):
            path += "index.html"
        if not (site_html / path).is_file():
            bad.append(f"{where} -> {path} (no such file)")
        elif fragment and path in visited and fragment not in visited[path]["ids"]:
            bad.append(f"{where} -> {path}#{fragment} (no such anchor)")
    return bad


def test_every_link_inside_the_site_and_its_anchor_resolve(visited, site_html, site_url):
    targets = [
        (page, *target)
        for page, facts in visited.items()
        for url in facts["links"]
        if (target := _target(url, site_url))
    ]
    assert len(targets) > 1000
    bad = _dangling(targets, visited, site_html)
    assert not bad, f"{len(bad)} broken links:\n" + "\n".join(sorted(set(bad))[:80])


def test_every_flashcard_and_every_grader_section_lands_on_its_heading(visited, site_html):
    cards = [
        (f"card {c.slug}", f"notebooks/{c.notebook_folder}.html", c.notebook.partition("#")[2])
        for c in load_deck()
    ]
    sections = []
    for assignment in grading.assignment_names(ROOT):
        for path in grading.source_notebooks(ROOT, assignment):
            for cell in nbformat.read(path, as_version=4).cells:
                anchor = cell.metadata.get("distlab", {}).get("flashcards", "")
                if "#" in anchor:  # what the grader prints: reread the notebook's section #...
                    folder, _, section = anchor.partition("#")
                    sections.append((f"grader {path.stem}", f"notebooks/{folder}.html", section))
    assert len(cards) > 300 and len(sections) >= 40
    bad = _dangling(cards + sections, visited, site_html)
    assert not bad, "\n".join(bad)


def test_each_notebook_page_offers_binder_download_grade_and_drill(visited, site_html):
    for assignment in grading.assignment_names(ROOT):
        facts = visited[f"notebooks/{assignment}.html"]
        binder = [u for u in facts["links"] if u.startswith("https://mybinder.org/v2/gh/")]
        assert binder and binder[0].endswith(f"course/{assignment}/{assignment}.ipynb"), binder
        downloads = [u for u in facts["links"] if u.endswith(f"/{assignment}.ipynb")]
        assert any("/_downloads/" in u for u in downloads), downloads
        page = (site_html / "notebooks" / f"{assignment}.html").read_text()
        text = html.unescape(re.sub(r"<[^>]+>", "", page))  # the code blocks' words, unstyled
        assert f"distlab grade {assignment[:2]}" in text
        assert f"flashcards drill --notebook {assignment}" in text


@pytest.mark.parametrize(
    "query,expected",
    [("ring all-reduce", "notebooks/02-collectives.html"), ("bubble", "notebooks/08-pipeline")],
)
def test_search_finds(reader, site_url, artifacts, query, expected):
    page = reader.page
    page.goto(f"{site_url}search.html?q={query.replace(' ', '+')}", wait_until="load")
    page.get_by_text("Search finished").wait_for()  # Sphinx lists the results one by one
    results = page.locator("#search-results ul.search li a")
    hrefs = [a.get_attribute("href") for a in results.all()]
    assert any(expected in (h or "") for h in hrefs), hrefs
    if query == "bubble":
        page.screenshot(path=str(artifacts / "site-search.png"))


def test_screenshots_of_the_landing_page_and_a_notebook_with_a_figure(reader, site_url, artifacts):
    page = reader.page
    page.goto(site_url + "index.html", wait_until="load")
    page.evaluate(MATH_DONE_JS)
    page.screenshot(path=str(artifacts / "site-landing.png"))
    page.goto(site_url + "notebooks/02-collectives.html", wait_until="load")
    page.evaluate(MATH_DONE_JS)
    figure = page.locator("div.cell_output img").first
    figure.scroll_into_view_if_needed()
    page.evaluate("() => window.scrollBy(0, -250)")
    page.screenshot(path=str(artifacts / "site-notebook.png"))
    assert figure.evaluate("img => img.naturalWidth") > 0
