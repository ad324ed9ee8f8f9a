"""Executed notebooks for the site: each solution notebook runs once, and its outputs are kept.

The site shows every demo cell's outputs from a real run. The test suite already runs every
solution notebook (``tests/test_course.py`` autogrades them with nbgrader), so it keeps what
it ran with :func:`store`, and the site build reads those copies back with :func:`find`
instead of running the course a second time. Only what no folder holds is run, by
:func:`execute`: the same nbgrader autograde the suite and ``distlab grade`` use.

An executed copy is ``<folder>/<assignment>.ipynb``; its metadata ``distlab_site`` records the
SHA-256 of the solution notebook it ran, so a copy of an older notebook is never used. A run in
which a cell raised (a solution notebook runs clean: a timing fit on an overloaded machine
once did not) is not kept, so no page shows a traceback. The
folders, in the order they are read (:func:`default_folders`):

* ``build/site-cache/executed/``: what the site build ran itself;
* ``.pytest_cache/d/executed-notebooks/``: what the last test run ran (pytest's own cache
  folder; ``tests/test_course.py`` writes it).

Reads nbformat only: no Sphinx, no torch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from distlab import grading
from distlab.core.course import assignment_names, source_notebook

#: where each executed copy says which solution notebook it ran
META_KEY = "distlab_site"
#: pytest's cache key (``config.cache.mkdir``) the course tests store their runs under
PYTEST_CACHE_KEY = "executed-notebooks"
#: the site build's own runs, relative to the course root
OWN_FOLDER = Path("build") / "site-cache" / "executed"


def source_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a solution notebook's bytes: the key an executed copy must match."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def default_folders(root: str | os.PathLike) -> list[Path]:
    """The folders :func:`find` reads by default, for the course checkout ``root``."""
    root = Path(root)
    return [root / OWN_FOLDER, root / ".pytest_cache" / "d" / PYTEST_CACHE_KEY]


def store(
    autograded: str | os.PathLike, folder: str | os.PathLike, root: str | os.PathLike
) -> list[str]:
    """Copy the notebooks nbgrader ran into ``folder``, each stamped with its source's digest.

    ``autograded``: one student's folder of nbgrader's ``autograded/`` (``<assignment>/
    <assignment>.ipynb`` inside), whose submissions were the solution notebooks of the course
    ``root``. A run with an error output is left out. Returns the assignments stored."""
    import nbformat

    autograded, folder = Path(autograded), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stored = []
    for assignment in assignment_names(root):
        ran = autograded / assignment / f"{assignment}.ipynb"
        if not ran.is_file():
            continue
        nb = nbformat.read(ran, as_version=4)
        if raised(nb):
            continue
        nb.metadata[META_KEY] = {"source_sha256": source_digest(source_notebook(root, assignment))}
        _write_atomically(nb, folder / f"{assignment}.ipynb")
        stored.append(assignment)
    return stored


def raised(nb) -> list[str]:
    """Ids of the cells of ``nb`` that have an error output."""
    return [
        cell.get("id", "?")
        for cell in nb.cells
        if any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    ]


def _write_atomically(nb, path: Path) -> None:
    """Write ``nb`` to ``path`` so that a reader never sees half a file."""
    import nbformat

    handle, partial = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    os.close(handle)
    nbformat.write(nb, partial)
    os.replace(partial, path)


def find(
    root: str | os.PathLike, assignment: str, folders: Iterable[str | os.PathLike]
) -> Path | None:
    """The first executed copy of ``assignment`` in ``folders`` that ran today's solution
    notebook (same SHA-256), or None."""
    import nbformat

    wanted = source_digest(source_notebook(root, assignment))
    for folder in folders:
        path = Path(folder) / f"{assignment}.ipynb"
        if not path.is_file():
            continue
        meta = nbformat.read(path, as_version=4).metadata.get(META_KEY, {})
        if meta.get("source_sha256") == wanted:
            return path
    return None


def execute(
    root: str | os.PathLike, assignments: list[str], folder: str | os.PathLike
) -> list[Path]:
    """Run the solution notebooks of ``assignments`` with nbgrader (as the tests do) and
    :func:`store` them in ``folder``; return the executed copies."""
    root, folder = Path(root), Path(folder)
    with tempfile.TemporaryDirectory(prefix="distlab-site-run-") as work:
        course_dir = Path(work)
        grading.prepare_course(course_dir, assignments, root=str(root))
        for assignment in assignments:
            grading.submit(course_dir, "site", assignment, source_notebook(root, assignment))
        grading.autograde(course_dir, student="site")
        ran = course_dir / "autograded" / "site"
        stored = store(ran, folder, root)
        failed = {a: _errors(ran / a / f"{a}.ipynb") for a in assignments if a not in stored}
    if failed:
        raise RuntimeError(
            "these solution notebooks did not run clean, so no page shows them: "
            + "; ".join(f"{a} ({why})" for a, why in failed.items())
        )
    return [folder / f"{a}.ipynb" for a in assignments]


def _errors(path: Path) -> str:
    """Which cells of an executed notebook raised, or why there is no executed notebook."""
    import nbformat

    if not path.is_file():
        return "nbgrader wrote no executed copy"
    return "cells that raised: " + ", ".join(raised(nbformat.read(path, as_version=4)))


def clear(folder: str | os.PathLike) -> None:
    """Forget the site build's own runs (``--fresh``)."""
    shutil.rmtree(folder, ignore_errors=True)


__all__ = [
    "META_KEY",
    "OWN_FOLDER",
    "PYTEST_CACHE_KEY",
    "clear",
    "default_folders",
    "execute",
    "find",
    "raised",
    "source_digest",
    "store",
]
