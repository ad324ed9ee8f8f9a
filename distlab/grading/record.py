"""What a learner's grades and checks were: one small JSON file per notebook, kept in their
own data folder.

``distlab grade`` (the official grade: the whole notebook, or ``--exercise K``, each in a
fresh kernel) and ``distlab.check`` (in the notebook's live kernel, not a grade) write the
result of each exercise they scored here; ``distlab progress`` reads it back. Nothing else
reads or writes these files.

Where: ``$DISTLAB_DATA_DIR/grades/NN-topic.json``, else the user data folder that the
flashcards' review store also uses (``platformdirs.user_data_dir("distlab")``). One file
per assignment::

    {"assignment": "02-collectives", "notebook": "02-collectives",
     "graded":  {"test-ring-reduce-scatter": {"title": ..., "points": 3.0, "max_points": 3.0,
                 "at": "2025-05-01T10:02:11+02:00", "how": "notebook" | "exercise",
                 "path": "/home/.../02-collectives.ipynb"}, ...},
     "checked": {"test-ring-reduce-scatter": {... "how": "check", "seconds": 0.8}, ...}}

Each exercise keeps its newest result of each kind, so a ``distlab grade 02 --exercise 1``
after a whole-notebook grade updates that exercise only. A write reads, updates and
replaces the file under a lock (``fcntl.flock`` on ``NN-topic.json.lock``), through a
temporary file and ``os.replace``, so two graders at once lose nothing and a reader never
sees half a file. A file that cannot be read as such a record is not overwritten: the
error names it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from datetime import datetime
from pathlib import Path

from distlab.grading.report import NotebookGrade

DATA_ENV_VAR = "DISTLAB_DATA_DIR"
FOLDER = "grades"
GRADED = "graded"  # an official grade: `distlab grade`, a fresh kernel
CHECKED = "checked"  # `distlab.check`: the live kernel, not a grade
KINDS = (GRADED, CHECKED)


class RecordError(ValueError):
    """A record file that is not one: the message names it and what to do."""


def data_dir() -> Path:
    """The learner's data folder: ``$DISTLAB_DATA_DIR``, else the user data folder."""
    override = os.environ.get(DATA_ENV_VAR)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("distlab"))


def records_dir(folder: str | os.PathLike | None = None) -> Path:
    """Where the records are: ``FOLDER`` in :func:`data_dir` (or in ``folder``)."""
    return (Path(folder) if folder is not None else data_dir()) / FOLDER


def now_iso() -> str:
    """Now, local time with its offset, to the second."""
    return datetime.now().astimezone().isoformat(timespec="seconds")


def read_records(folder: str | os.PathLike | None = None) -> dict[str, dict]:
    """assignment -> its record, for every record file in :func:`records_dir` (empty when
    nothing was recorded yet). RecordError names a file that is not a record."""
    where = records_dir(folder)
    if not where.is_dir():
        return {}
    return {path.stem: _read(path) for path in sorted(where.glob("*.json"))}


def _read(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RecordError(
            f"{path} is not a distlab grade record ({exc}); move it away (distlab writes a new "
            f"one) or point ${DATA_ENV_VAR} at another folder"
        ) from None
    if not isinstance(record, dict) or not all(
        isinstance(record.get(kind, {}), dict) for kind in KINDS
    ):
        raise RecordError(
            f"{path} is not a distlab grade record (expected an object with {KINDS}); move it "
            f"away (distlab writes a new one) or point ${DATA_ENV_VAR} at another folder"
        )
    return record


def record(
    grade: NotebookGrade,
    kind: str,
    how: str,
    folder: str | os.PathLike | None = None,
    at: str | None = None,
    seconds: float | None = None,
) -> Path:
    """Record each exercise of ``grade`` as the newest ``kind`` result (:data:`GRADED` or
    :data:`CHECKED`) of its notebook; ``how`` says what scored it ("notebook", "exercise",
    "check"). Returns the record file."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    where = records_dir(folder)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{grade.assignment}.json"
    entry = {"at": at or now_iso(), "how": how, "path": grade.path or None}
    if seconds is not None:
        entry["seconds"] = round(seconds, 3)
    with _locked(path):
        current = _read(path) if path.exists() else {}
        current.update(assignment=grade.assignment, notebook=grade.notebook)
        results = current.setdefault(kind, {})
        for e in grade.exercises:
            results[e.grade_id] = {
                "title": e.title,
                "points": e.points,
                "max_points": e.max_points,
                **entry,
            }
        for other in KINDS:
            current.setdefault(other, {})
        _write_atomically(path, json.dumps(current, indent=1, sort_keys=True))
    return path


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock on ``path``'s lock file (where ``fcntl`` exists)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the rename is still atomic
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomically(path: Path, text: str) -> None:
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def record_quietly(grade: NotebookGrade, kind: str, how: str, **kwargs) -> str | None:
    """:func:`record`, but a folder that cannot be written (or a damaged record) costs the
    grade nothing: None when recorded, else one line that says why not."""
    try:
        record(grade, kind, how, **kwargs)
    except (OSError, RecordError) as exc:
        return f"not recorded for `distlab progress`: {exc}"
    return None
