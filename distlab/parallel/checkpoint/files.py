"""Checkpoint folders that are either whole and verified, or refused by name.

A save can die half way (a rank killed, a full disk, a laptop lid closed),
and a file can be damaged or swapped later. Loading such a checkpoint must
fail with the file's name, never resume from silently wrong state. Three
rules give that:

1. **Write somewhere new, then commit.** A sharded save writes into a fresh
   folder ``PATH/data-<token>/``. Only when every rank has finished does rank
   0 write ``PATH/COMMIT.json`` (to a temporary name, flushed to disk, then
   ``os.replace``: one atomic step). Until then the previous ``COMMIT.json``
   still names the previous data folder, which is removed only after the new
   commit. A killed save therefore leaves the last good checkpoint loadable;
   a folder without ``COMMIT.json`` is refused as incomplete.
2. **A checksum per file.** ``COMMIT.json`` lists every file of the data
   folder with its size and SHA-256, and its own SHA-256 over that list. A
   load verifies every file first (each rank hashes a share and all ranks
   agree on the verdict), so a flipped byte, a truncated or missing shard, or
   a shard copied from another save is refused with the file's name.
3. **Resume from the last good commit.** :func:`latest_checkpoint` picks the
   highest ``step-N`` folder that holds a commit, skipping one whose save was
   interrupted; it reads only the commits. A restart should call
   :func:`~distlab.parallel.checkpoint.data_parallel.latest_verified_checkpoint` instead,
   which also checks the files (rule 2) and falls back past a damaged step,
   warning which steps it skipped and why.

A single-file (full) checkpoint is written to a temporary name and renamed;
its checksum is computed over the tensors it holds and stored inside it.

This is the pattern of production checkpointers (write, then publish a small
manifest atomically), written out so it can be read in one sitting.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

COMMIT = "COMMIT.json"
FORMAT = "distlab-sharded-checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted: incomplete, damaged, or not a checkpoint."""


class CheckpointWarning(UserWarning):
    """A checkpoint was passed over (a restart skipped a damaged or incomplete step)."""


# -------------------------------------------------------------- checksums ---


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (``benchmarks/checkpoint_checksum.py`` measures the rate)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def describe_files(folder: Path, names: Iterable[str]) -> dict[str, dict]:
    """``{name: {"bytes": size, "sha256": digest}}`` for files of ``folder``."""
    return {
        name: {"bytes": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)}
        for name in names
    }


def file_problems(folder: Path, expected: dict[str, dict], names: Iterable[str]) -> list[str]:
    """What is wrong with files ``names`` of ``folder`` against ``expected`` (empty if fine)."""
    problems = []
    for name in names:
        path, want = folder / name, expected[name]
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != want["bytes"]:
            problems.append(
                f"{path} has {path.stat().st_size} bytes, the commit recorded {want['bytes']} "
                "(truncated or replaced)"
            )
        elif file_sha256(path) != want["sha256"]:
            problems.append(
                f"{path}: its SHA-256 differs from the one recorded at save "
                "(damaged, or a file from another checkpoint)"
            )
    return problems


def share(names: Iterable[str], rank: int, world_size: int) -> list[str]:
    """Rank ``rank``'s share of the files to hash: every ``world_size``-th, sorted."""
    return sorted(names)[rank::world_size]


def _digest_of(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "commit_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------ the commit ---


def new_data_folder() -> str:
    """A fresh data folder name for a save (rank 0 picks it and tells the others)."""
    return f"data-{uuid.uuid4().hex[:12]}"


def remove_uncommitted(path: Path) -> None:
    """Delete data folders of ``path`` that its commit does not name (interrupted saves)."""
    keep = _committed_data(path)
    for child in path.glob("data-*"):
        if child.name != keep:
            shutil.rmtree(child, ignore_errors=True)


def _committed_data(path: Path) -> str | None:
    try:
        return read_commit(path)["data"]
    except CheckpointError:
        return None


def write_commit(path: Path, data: str, files: dict[str, dict], world_size: int) -> None:
    """Publish ``PATH/data`` as the checkpoint at ``path``: one atomic rename.

    Then remove the data folder of the previous commit (and any other stale one).
    """
    record = {"format": FORMAT, "data": data, "world_size": world_size, "files": files}
    record["commit_sha256"] = _digest_of(record)
    temporary = path / f".{COMMIT}.{data}.tmp"
    with open(temporary, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    publish(temporary, path / COMMIT)
    remove_uncommitted(path)


def publish(temporary: Path, final: Path) -> None:
    """The commit itself: an atomic rename, made durable. Before it, the old commit holds."""
    os.replace(temporary, final)
    _fsync_folder(final.parent)


def _fsync_folder(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_commit(path: str | os.PathLike) -> dict:
    """The commit record of checkpoint folder ``path``; :class:`CheckpointError` if none is valid."""
    path = Path(path)
    commit = path / COMMIT
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a checkpoint folder (it does not exist)")
    if not commit.is_file():
        raise CheckpointError(
            f"{path} is incomplete: {COMMIT} is missing, so the save that wrote it did not "
            "finish (or the folder was not written by distlab's save_sharded)"
        )
    try:
        record = json.loads(commit.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{commit} is damaged: not valid JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{commit} is not a distlab checkpoint commit (format {FORMAT})")
    if record.get("commit_sha256") != _digest_of(record):
        raise CheckpointError(f"{commit} is damaged: its own checksum does not match its content")
    return record


def data_folder(path: str | os.PathLike, record: dict | None = None) -> Path:
    """The data folder that the commit of checkpoint folder ``path`` names.

    ``record``: that commit, if already read (:func:`read_commit`). A commit whose
    data folder is gone (deleted or moved by hand, a partial copy) raises a
    :class:`CheckpointError` naming the folder, rather than one error per file in it.
    """
    record = read_commit(path) if record is None else record
    data = Path(path) / record["data"]
    if not data.is_dir():
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded: the data folder {data.name} that its {COMMIT} "
            f"names is missing ({data} was deleted or moved, or the checkpoint was copied "
            f"without it), so none of its {len(record['files'])} files can be read"
        )
    return data


def step_folders(folder: str | os.PathLike, prefix: str = "step-") -> list[tuple[int, Path]]:
    """``[(N, folder/prefixN), ...]`` for every ``prefixN`` folder, highest ``N`` first."""
    found = []
    for child in Path(folder).glob(f"{prefix}*"):
        suffix = child.name[len(prefix) :]
        if suffix.isdigit() and child.is_dir():
            found.append((int(suffix), child))
    return sorted(found, reverse=True)


def latest_checkpoint(folder: str | os.PathLike, prefix: str = "step-") -> tuple[int, Path] | None:
    """``(N, folder/prefixN)`` for the highest ``N`` whose checkpoint was committed, or None.

    A ``step-N`` folder whose save was interrupted has no valid commit and is
    skipped. Only the commits are read, not the files they list: a committed
    step whose shard was damaged afterwards is still returned, and loading it
    fails. To restart, use
    :func:`~distlab.parallel.checkpoint.data_parallel.latest_verified_checkpoint`, which
    verifies each step's files, newest first, and falls back to the newest that
    loads.
    """
    for step, child in step_folders(folder, prefix):
        try:
            read_commit(child)
        except CheckpointError:
            continue
        return step, child
    return None
