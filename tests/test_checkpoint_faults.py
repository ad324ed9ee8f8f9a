"""Checkpoints that cannot load wrong (issue 30): damaged, torn and foreign checkpoints are
refused with the file's name, and a save killed at any point leaves the last committed
checkpoint loadable bit for bit.

One launch of 2 ranks trains ZeRO-1 with Adam (so Adam's m and v are sharded across the
files) and saves ``step-2`` and ``step-4``. The damage is then done here, on copies: byte
flips in every file, a shard from the other step, a missing, a truncated shard, a damaged
``.metadata`` and ``COMMIT.json``, no commit. One more launch tries to load each copy on
both ranks. Saves are then killed at fixed points and at random times, in place and into
a new folder.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
import torch

import distlab
from distlab.parallel.checkpoint.files import COMMIT, CheckpointError, latest_checkpoint

pytestmark = pytest.mark.timeout(600)


def _trainer(seed):
    import torch

    from distlab.models import GPT, GPTConfig
    from distlab.parallel.data import training as T

    torch.set_num_threads(1)
    return T.build("zero1", GPT(GPTConfig(layers=1), seed=seed), algorithm="builtin", lr=1e-2)


def _train(trainer, first, n):
    from distlab.models import GPTConfig, gpt_batch
    from distlab.parallel.data import training as T

    for step in range(first, first + n):
        T.train_step(trainer, gpt_batch(8, GPTConfig(layers=1), seed=step), T.lm_loss)


def _state(trainer):
    from distlab.parallel.checkpoint.data_parallel import full_state

    state = full_state(trainer.model, trainer.optimizer)
    return {"params": state["params"], "optimizer": state["optimizer"]}


def _save_two_steps(rank, world_size, folder):
    from distlab.parallel import save_full, save_sharded

    trainer = _trainer(seed=1)
    states = {}
    for step in (2, 4):
        _train(trainer, step - 2, 2)
        save_sharded(f"{folder}/step-{step}", trainer.model, trainer.optimizer)
        save_full(f"{folder}/full-{step}.pt", trainer.model, trainer.optimizer)
        states[step] = _state(trainer)
    return states


def _try_load(rank, world_size, paths):
    from distlab.parallel import CheckpointError, load_full, load_sharded

    out = {}
    for path in paths:
        trainer = _trainer(seed=7)
        load = load_full if path.endswith(".pt") else load_sharded
        try:
            load(path, trainer.model, trainer.optimizer)
        except CheckpointError as exc:
            out[path] = str(exc)
        else:
            out[path] = _state(trainer)
    return out


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    states = distlab.run(_save_two_steps, 2, args=(str(folder),), timeout=240)
    return folder, states[0]


def _data_files(checkpoint: Path) -> list[Path]:
    data = [p for p in checkpoint.iterdir() if p.name.startswith("data-")]
    assert len(data) == 1, data
    return sorted(data[0].iterdir())


def _flip(path: Path, rng: random.Random) -> int:
    raw = bytearray(path.read_bytes())
    at = rng.randrange(len(raw))
    raw[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(raw))
    return at


def _damaged_copies(folder: Path, out: Path) -> dict[str, str]:
    """copy path -> the file name its error must mention."""
    rng = random.Random(30)
    cases = {}

    def copy(tag: str) -> Path:
        target = out / tag
        shutil.copytree(folder / "step-4", target)
        return target

    names = [p.name for p in _data_files(folder / "step-4")]
    assert ".metadata" in names and sum(n.endswith(".distcp") for n in names) == 2, names
    for name in names:
        for i in range(4):  # byte flips anywhere in every file
            target = copy(f"flip-{name}-{i}")
            _flip(next(p for p in _data_files(target) if p.name == name), rng)
            cases[str(target)] = name
    for name in (n for n in names if n.endswith(".distcp")):
        target = copy(f"foreign-{name}")  # the same rank's file of another step
        other = next(p for p in _data_files(folder / "step-2") if p.name == name)
        shutil.copyfile(other, next(p for p in _data_files(target) if p.name == name))
        cases[str(target)] = name
        target = copy(f"missing-{name}")
        next(p for p in _data_files(target) if p.name == name).unlink()
        cases[str(target)] = name
        target = copy(f"truncated-{name}")
        victim = next(p for p in _data_files(target) if p.name == name)
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        cases[str(target)] = name
    target = copy("commit-flipped")
    raw = bytearray((target / COMMIT).read_bytes())
    raw[raw.index(b'"sha256": "') + 15] ^= 0x01  # a digit of a recorded checksum
    (target / COMMIT).write_bytes(bytes(raw))
    cases[str(target)] = COMMIT
    target = copy("no-commit")
    (target / COMMIT).unlink()
    cases[str(target)] = COMMIT
    for i in range(4):
        target = out / f"full-flip-{i}.pt"
        shutil.copyfile(folder / "full-4.pt", target)
        _flip(target, rng)
        cases[str(target)] = target.name
    return cases


@pytest.mark.slow
def test_damaged_torn_and_foreign_checkpoints_are_refused_by_name(saved, tmp_path):
    folder, _ = saved
    cases = _damaged_copies(folder, tmp_path)
    results = distlab.run(_try_load, 2, args=(sorted(cases),), timeout=300)
    for path, must_name in cases.items():
        verdicts = [r[path] for r in results]
        for verdict in verdicts:
            assert isinstance(verdict, str), f"{path} loaded without error"
            assert must_name in verdict, (path, verdict)
        assert verdicts[0] == verdicts[1], "every rank raises the same error"
    assert len(cases) == 24  # 12 flips, 6 foreign/missing/truncated shards, 2 commits, 4 full


def test_intact_checkpoints_still_load_bit_for_bit(saved):
    folder, states = saved
    paths = [str(folder / "step-2"), str(folder / "step-4"), str(folder / "full-4.pt")]
    loaded = distlab.run(_try_load, 2, args=(paths,), timeout=240)[0]
    assert _equal(loaded[paths[0]], states[2])
    assert _equal(loaded[paths[1]], states[4]) and _equal(loaded[paths[2]], states[4])


# ------------------------------------------------------------ killed saves ---


def _save_and_die(rank, world_size, folder, target, when, victim):
    """Load the committed step-2 at ``folder``, train 2 steps, save to ``target``; rank
    ``victim`` dies at ``when`` (a point of the save, or a delay in seconds)."""
    import os
    import threading

    import torch.distributed.checkpoint as dcp

    from distlab.parallel import load_sharded, save_sharded
    from distlab.parallel.checkpoint import files

    trainer = _trainer(seed=7)
    load_sharded(f"{folder}/step-2", trainer.model, trainer.optimizer)
    _train(trainer, 2, 2)

    def die_after(fn):
        def wrapped(*args, **kwargs):
            result = fn(*args, **kwargs)
            os._exit(3)
            return result

        return wrapped

    def die_before(fn):
        def wrapped(*args, **kwargs):
            os._exit(3)

        return wrapped

    timer = threading.Timer(when if isinstance(when, float) else 0.0, lambda: os._exit(3))
    if rank == victim:
        if isinstance(when, float):
            timer.start()
        elif when == "before-write":
            dcp.save = die_before(dcp.save)
        elif when == "after-write":
            dcp.save = die_after(dcp.save)
        elif when == "while-hashing":
            files.describe_files = die_after(files.describe_files)
        elif when == "before-rename":
            files.publish = die_before(files.publish)
        elif when == "after-rename":
            files._fsync_folder = die_before(files._fsync_folder)
    save_sharded(target, trainer.model, trainer.optimizer)
    timer.cancel()  # a kill that comes after the save would only hit an idle worker
    return _state(trainer)


POINTS = ["before-write", "after-write", "while-hashing", "before-rename", "after-rename"]


@pytest.mark.slow
def test_a_save_killed_at_any_point_leaves_the_last_commit_loadable(saved, tmp_path):
    """In place: the folder loads as the old step or the new one, never neither, never wrong."""
    folder, states = saved
    rng = random.Random(4)
    kills = [(p, 0 if p.endswith("rename") else 1) for p in POINTS]
    kills += [(round(rng.uniform(0.0, 1.5), 3), rng.randrange(2)) for _ in range(4)]
    outcome = {}
    for i, (when, victim) in enumerate(kills):
        run = tmp_path / f"run-{i}"
        shutil.copytree(folder / "step-2", run / "step-2")
        try:
            new = distlab.run(
                _save_and_die, 2, args=(str(run), str(run / "step-2"), when, victim), timeout=240
            )[0]
        except distlab.RankError:
            new = None
        loaded = distlab.run(_try_load, 2, args=([str(run / "step-2")],), timeout=240)
        got = loaded[0][str(run / "step-2")]
        assert not isinstance(got, str), f"kill {when}: the last checkpoint was lost: {got}"
        if _equal(got, states[2]):
            outcome[when] = "old"
        else:
            assert new is not None or when == "after-rename" or isinstance(when, float), when
            outcome[when] = "new"
        assert outcome[when] == "old" or new is None or _equal(got, new), when
        data = [p.name for p in (run / "step-2").iterdir() if p.name.startswith("data-")]
        assert len(data) <= 2, data  # the committed data, at most one torn save's
    assert outcome["before-rename"] == "old" and outcome["after-rename"] == "new"


def test_a_save_killed_into_a_new_folder_is_skipped_on_restart(saved, tmp_path):
    """Notebook 10's restart: step-4 torn, step-2 whole -> resume from step-2."""
    folder, _ = saved
    run = tmp_path / "elastic"
    shutil.copytree(folder / "step-2", run / "step-2")
    with pytest.raises(distlab.RankError):
        distlab.run(
            _save_and_die, 2, args=(str(run), str(run / "step-4"), "while-hashing", 1), timeout=240
        )
    assert (run / "step-4").is_dir() and not (run / "step-4" / COMMIT).exists()
    assert latest_checkpoint(run) == (2, run / "step-2")
    torn = distlab.run(_try_load, 2, args=([str(run / "step-4")],), timeout=240)[0]
    assert "incomplete" in torn[str(run / "step-4")] and COMMIT in torn[str(run / "step-4")]
    # the next save into the torn folder cleans it up and commits
    distlab.run(_save_and_die, 2, args=(str(run), str(run / "step-4"), None, -1), timeout=240)
    assert latest_checkpoint(run) == (4, run / "step-4")
    assert len([p for p in (run / "step-4").iterdir() if p.name.startswith("data-")]) == 1


def test_latest_checkpoint_and_read_commit_errors(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "step-9").mkdir()
    (tmp_path / "step-x").mkdir()
    assert latest_checkpoint(tmp_path) is None
    from distlab.parallel.checkpoint.files import read_commit

    with pytest.raises(CheckpointError, match="does not exist"):
        read_commit(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="incomplete"):
        read_commit(tmp_path / "step-9")
    (tmp_path / "step-9" / COMMIT).write_bytes(b"\xff\xfe not json")
    with pytest.raises(CheckpointError, match="COMMIT.json is damaged"):
        read_commit(tmp_path / "step-9")
    assert os.listdir(tmp_path)  # nothing was deleted by reading
