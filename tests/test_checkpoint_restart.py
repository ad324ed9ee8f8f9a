"""Restarting from the newest checkpoint that verifies, and a commit whose data folder is gone.

The checkpoints here are small committed folders written with the commit machinery of
:mod:`distlab.parallel.checkpoint.files` (a data folder of a few files, each file's size
and SHA-256 in ``COMMIT.json``): verification reads only those, whatever the files hold.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest

import distlab
from distlab.parallel.checkpoint import files
from distlab.parallel.checkpoint.data_parallel import (
    CheckpointError,
    CheckpointWarning,
    latest_checkpoint,
    latest_verified_checkpoint,
    verify_sharded,
)
from distlab.parallel.compose.checkpoint import read_manifest

SHARDS = ("__0_0.distcp", "__1_0.distcp", ".metadata")


def commit(path: Path, world_size: int = 2) -> Path:
    """A committed checkpoint folder at ``path``; returns its data folder."""
    path.mkdir(parents=True)
    data = path / files.new_data_folder()
    data.mkdir()
    for name in SHARDS:
        (data / name).write_bytes(os.urandom(256))
    files.write_commit(path, data.name, files.describe_files(data, SHARDS), world_size)
    return data


def flip_a_bit(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    path.write_bytes(bytes(raw))


@pytest.fixture
def run(tmp_path):
    """step-2 whole; step-4 whose data folder is gone; step-6 with a flipped bit; step-8
    whose save never committed."""
    run = tmp_path / "run"
    commit(run / "step-2")
    shutil.rmtree(commit(run / "step-4"))
    flip_a_bit(commit(run / "step-6") / "__1_0.distcp")
    (run / "step-8" / "data-torn").mkdir(parents=True)
    return run


def test_restart_falls_back_past_damaged_steps_and_says_why(run):
    assert latest_checkpoint(run) == (6, run / "step-6")  # committed, but it cannot load
    with pytest.warns(CheckpointWarning) as caught:
        assert latest_verified_checkpoint(run) == (2, run / "step-2")
    notes = [str(w.message) for w in caught]
    assert len(notes) == 3, notes
    eight, six, four = notes
    assert eight.startswith("restart: skipping step 8:") and "incomplete" in eight
    assert six.startswith("restart: skipping step 6:") and "__1_0.distcp" in six
    assert "SHA-256 differs" in six
    assert four.startswith("restart: skipping step 4:") and "data folder" in four


def test_restart_stops_at_the_first_step_that_verifies(run, monkeypatch):
    """The newest good step is hashed; older ones are not read at all."""
    hashed = []
    real = files.file_sha256
    monkeypatch.setattr(files, "file_sha256", lambda p: hashed.append(Path(p)) or real(p))
    shutil.rmtree(run / "step-6")
    shutil.rmtree(run / "step-8")
    commit(run / "step-10")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing newer was skipped: no warning
        assert latest_verified_checkpoint(run) == (10, run / "step-10")
    assert {p.parent.parent.name for p in hashed} == {"step-10"}


def test_restart_with_nothing_that_verifies(tmp_path):
    assert latest_verified_checkpoint(tmp_path) is None
    flip_a_bit(commit(tmp_path / "step-3") / ".metadata")
    with pytest.warns(CheckpointWarning, match="skipping step 3"):
        assert latest_verified_checkpoint(tmp_path) is None


def test_a_missing_data_folder_is_named_not_counted_as_missing_files(tmp_path):
    data = commit(tmp_path / "step-1")
    shutil.rmtree(data)
    for load in (verify_sharded, read_manifest):
        with pytest.raises(CheckpointError) as refused:
            load(tmp_path / "step-1")
        message = str(refused.value)
        assert f"the data folder {data.name} that its COMMIT.json names is missing" in message
        assert str(data) in message and "is missing\n" not in message, message
        assert not any(name in message for name in SHARDS), message
    # a data folder that is there but lost a file still names that file
    data = commit(tmp_path / "step-2")
    (data / "__1_0.distcp").unlink()
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp is missing"):
        verify_sharded(tmp_path / "step-2")


def _restart_on_every_rank(rank, world_size, folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = latest_verified_checkpoint(folder)
    return found, [str(w.message) for w in caught if w.category is CheckpointWarning]


def test_ranks_agree_and_rank_0_alone_warns(run):
    """Collective: each rank hashes a share, all return the same step, one warning each."""
    (found0, notes0), (found1, notes1) = distlab.run(
        _restart_on_every_rank, 2, args=(str(run),), timeout=60
    )
    assert found0 == found1 == (2, run / "step-2")
    assert [n.split(":")[1] for n in notes0] == [
        " skipping step 8",
        " skipping step 6",
        " skipping step 4",
    ]
    assert notes1 == []
