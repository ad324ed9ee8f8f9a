"""``distlab site build``: the course as a folder of static pages, built offline.

The steps, each in its own module:

1. the executed solution notebooks: the test run's or an earlier build's copies where they
   ran today's notebooks, the rest run now with nbgrader (:mod:`distlab.site.executed`);
2. the sources, staged in ``<out>/src``: the hand-written pages of ``docs/``, one page per
   notebook as released with its demo outputs (:mod:`distlab.site.pages`), the deck by
   notebook (:mod:`distlab.site.deck`) and one page per library area
   (:mod:`distlab.site.api`);
3. Sphinx (configured in :mod:`distlab.site.conf`) writes ``<out>/html``, with a local
   MathJax in ``_static/mathjax``.

It prints what it reused and ran, the time it took and the site's size. A staged file is
rewritten only when its text changes, so a second build re-reads only what changed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from distlab.core.course import assignment_names, find_course_root, released_notebook
from distlab.site import api, deck, executed, pages
from distlab.site.files import folder_size, write_if_changed
from flashcards.model import load_deck

#: the hand-written pages, relative to the course root
DOCS_DIR = "docs"
#: where the site goes by default, relative to the course root
DEFAULT_OUT = Path("build") / "site"
CONF_DIR = Path(__file__).resolve().parent


@dataclass
class BuildReport:
    """What a build did: where the site is, what it reused and ran, its time and size."""

    html: Path
    reused: dict[str, Path] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    seconds: float = 0.0
    bytes: int = 0
    files: int = 0
    warnings: int = 0

    def summary(self) -> str:
        """What the command prints: outputs reused and run, warnings, time and size."""
        sources = sorted({str(p.parent) for p in self.reused.values()})
        reused = f"site: outputs of {len(self.reused)} notebooks reused"
        if sources:
            reused += f" (from {', '.join(sources)})"
        ran = f"{len(self.ran)} notebooks executed now" + (
            f": {', '.join(self.ran)}" if self.ran else ""
        )
        warnings = self.html.parent / "warnings.txt"
        size = f"{self.bytes / 1e6:.1f} MB in {self.files} files"
        serve = f"python -m http.server --directory {self.html}"
        return "\n".join(
            [
                f"{reused}; {ran}",
                f"site: {self.warnings} Sphinx warnings (listed in {warnings})",
                f"site: built {self.html} in {self.seconds:.0f} s: {size}",
                f"site: open {self.html / 'index.html'} or serve the folder: {serve}",
            ]
        )


#: the parts of MathJax 3's ``es5/`` folder the pages load: the TeX/MathML-to-HTML bundle,
#: and what it loads on demand (TeX extensions, fonts, the menu and its accessibility tools)
MATHJAX_PARTS = ("tex-mml-chtml.js", "input", "output", "ui", "a11y", "sre", "adaptors")


def mathjax_folder() -> Path:
    """MathJax 3's ``es5/`` folder, as the ``django-static-mathjax`` package installs it."""
    spec = importlib.util.find_spec("mathjax")
    folder = Path(spec.origin).parent / "static" / "mathjax" / "es5" if spec else None
    if folder is None or not (folder / "tex-mml-chtml.js").is_file():
        raise RuntimeError(
            'the site needs MathJax from the django-static-mathjax package (the "site" '
            'extra): pip install -e ".[site]"'
        )
    return folder


def copy_mathjax(target: Path) -> None:
    """Copy :data:`MATHJAX_PARTS` into ``target`` once."""
    if (target / "tex-mml-chtml.js").is_file():
        return
    source = mathjax_folder()
    target.mkdir(parents=True, exist_ok=True)
    for part in MATHJAX_PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, target / part)
        else:
            shutil.copy2(source / part, target / part)


def executed_notebooks(
    root: Path, folders: list[Path], own: Path, run_missing: bool, report: BuildReport
) -> dict[str, Path]:
    """Assignment -> its executed copy: found in ``folders``, else run now into ``own``."""
    found = {a: executed.find(root, a, [own, *folders]) for a in assignment_names(root)}
    missing = [a for a, path in found.items() if path is None]
    if missing and not run_missing:
        raise RuntimeError(
            f"no executed copy of {', '.join(missing)} that ran today's solution notebook in "
            f"{', '.join(str(f) for f in [own, *folders])}; run the course tests "
            "(python -m pytest tests/test_course.py) or build without --no-execute"
        )
    report.reused = {a: p for a, p in found.items() if p is not None}
    if missing:
        print(f"site: running {len(missing)} notebooks with nbgrader: {', '.join(missing)}")
        for assignment, path in zip(missing, executed.execute(root, missing, own), strict=True):
            found[assignment] = path
        report.ran = missing
    return found


def stage_notebooks(
    root: Path, ran: dict[str, Path], src: Path
) -> tuple[dict[str, str], list[Path]]:
    """Write each notebook's page and its released copy into ``src/notebooks``; return
    assignment -> title (the notebook's first heading), and the files written."""
    import nbformat

    titles, written = {}, []
    for assignment, path in ran.items():
        released_path = released_notebook(root, assignment)
        released = nbformat.read(released_path, as_version=4)
        page = pages.learner_page(released, nbformat.read(path, as_version=4), assignment)
        box = pages.work_on_it(assignment, f"released/{assignment}.ipynb")
        page.cells.insert(1, nbformat.v4.new_markdown_cell(box, id="distlab-site-work-on-it"))
        page_path = src / "notebooks" / f"{assignment}.ipynb"
        download = src / "notebooks" / "released" / f"{assignment}.ipynb"
        write_if_changed(page_path, nbformat.writes(page))
        write_if_changed(download, released_path.read_text("utf-8"))
        written += [page_path, download]
        first = released.cells[0].source.splitlines()[0]
        titles[assignment] = first.lstrip("#").strip()
    return titles, written


def stage_docs(root: Path, src: Path) -> list[Path]:
    """Copy the hand-written pages (``docs/``) into ``src``; return the copies."""
    docs = root / DOCS_DIR
    if not docs.is_dir():
        raise FileNotFoundError(f"no {DOCS_DIR}/ in {root}: the site's pages live there")
    copies = []
    for path in sorted(p for p in docs.rglob("*") if p.is_file()):
        target = src / path.relative_to(docs)
        if path.suffix in (".md", ".txt"):
            write_if_changed(target, path.read_text("utf-8"))
        elif not target.is_file() or target.read_bytes() != path.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        copies.append(target)
    return copies


def stage(root: Path, ran: dict[str, Path], src: Path) -> None:
    """All the sources Sphinx reads, in ``src``; a file an earlier build staged that this one
    does not (a page since removed) is deleted, so that Sphinx does not show it."""
    staged = stage_docs(root, src)
    titles, notebooks = stage_notebooks(root, ran, src)
    solutions = {a: root / "solutions" / a / f"{a}.ipynb" for a in ran}
    staged += notebooks
    staged += deck.write_deck_pages(load_deck(), src / "flashcards", solutions, titles)
    staged += api.write_api_pages(src / "library")
    keep = {path.resolve() for path in staged}
    for path in [p for p in src.rglob("*") if p.is_file() and p.resolve() not in keep]:
        path.unlink()


def run_sphinx(src: Path, out: Path, jobs: str) -> int:
    """Sphinx's HTML build of ``src`` into ``out/html``; returns the number of warnings and
    errors it wrote to ``out/warnings.txt``."""
    from sphinx.cmd.build import build_main

    static = out / "static"
    copy_mathjax(static / "mathjax")
    warnings = out / "warnings.txt"
    shutil.rmtree(out / "html", ignore_errors=True)  # no page or file of an earlier build stays
    args = [
        "-b", "html", "-q", "-j", jobs, "-c", str(CONF_DIR), "-d", str(out / "doctrees"),
        "-w", str(warnings), "-D", f"html_static_path={CONF_DIR / '_static'},{static}",
        str(src), str(out / "html"),
    ]  # fmt: skip
    code = build_main(args)
    if code != 0:
        raise RuntimeError(f"Sphinx failed ({code}); its messages are above and in {warnings}")
    lines = warnings.read_text("utf-8").splitlines()
    return sum(1 for line in lines if "WARNING:" in line or "ERROR:" in line)


def build(
    out: str | os.PathLike | None = None,
    *,
    root: str | os.PathLike | None = None,
    executed_folders: list[str | os.PathLike] | None = None,
    run_missing: bool = True,
    fresh: bool = False,
    jobs: str = "auto",
) -> BuildReport:
    """Build the site into ``out`` (default ``build/site`` of the course checkout); the pages
    are in ``<out>/html``. See the module for the steps and :func:`executed_notebooks` for
    ``executed_folders`` (default: :func:`distlab.site.executed.default_folders`),
    ``run_missing`` and ``fresh`` (run every notebook again)."""
    start = time.monotonic()
    root = find_course_root(root)
    out = Path(out).resolve() if out is not None else root / DEFAULT_OUT
    own = root / executed.OWN_FOLDER
    if fresh:
        executed.clear(own)
        folders = []
    else:
        defaults = executed.default_folders(root)[1:]
        folders = [Path(f) for f in executed_folders] if executed_folders else defaults
    report = BuildReport(html=out / "html")
    ran = executed_notebooks(root, folders, own, run_missing, report)
    stage(root, ran, out / "src")
    report.warnings = run_sphinx(out / "src", out, jobs)
    report.seconds = time.monotonic() - start
    report.bytes, report.files = folder_size(report.html)
    return report
