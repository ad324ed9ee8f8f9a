"""The worker starter (Linux): workers forked from one process that imported torch, exit
codes reported as Popen reports them, a fresh Python when the environment changed, and
nothing left when the parent goes."""

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import distlab
from distlab import launch
from distlab.launch import parent, starter

pytestmark = pytest.mark.skipif(not starter.CAN_FORK, reason="workers are forked on Linux only")


def _parent_and_variable(rank, world_size):
    return os.getppid(), os.environ.get("DISTLAB_STARTER_PROBE")


def _exit_with(rank, world_size, code):
    if rank == 1:
        os._exit(code)
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))


@pytest.mark.slow
def test_warm_workers_are_forked_by_the_starter():
    launch.shutdown()
    parents = {ppid for ppid, _ in distlab.run(_parent_and_variable, 2)}
    assert parent._starter.pid is not None and parents == {parent._starter.pid}


@pytest.mark.slow
def test_prestart_starts_the_starter_that_the_first_run_uses():
    launch.shutdown()
    launch.prestart()
    started = parent._starter.pid
    assert started is not None
    assert {ppid for ppid, _ in distlab.run(_parent_and_variable, 2)} == {started}


@pytest.mark.slow
def test_a_cold_run_starts_no_starter():
    launch.shutdown()
    parents = {ppid for ppid, _ in distlab.run(_parent_and_variable, 2, warm=False)}
    assert parents == {os.getpid()} and parent._starter.pid is None


@pytest.mark.slow
def test_a_changed_environment_reaches_the_workers(monkeypatch):
    """A variable set after the starter started reaches a fork; one that torch may read
    at import (OMP_*) gets a worker that imports torch itself, a fresh Python."""
    distlab.run(_parent_and_variable, 2)  # the starter exists, with the old environment
    starter_pid = parent._starter.pid
    _retire_idle_workers()
    monkeypatch.setenv("DISTLAB_STARTER_PROBE", "set later")
    assert distlab.run(_parent_and_variable, 2) == [(starter_pid, "set later")] * 2
    _retire_idle_workers()
    monkeypatch.setenv("OMP_DISTLAB_STARTER_PROBE", "read at import?")
    assert distlab.run(_parent_and_variable, 2) == [(os.getpid(), "set later")] * 2
    _retire_idle_workers()


def _retire_idle_workers():
    """Empty the warm pool, and keep the starter."""
    with parent._pool_lock:
        while parent._idle:
            parent._idle.pop().kill()


def _preloaded_before_the_job(rank, world_size, names):
    import sys

    return [name for name in names if name not in sys.modules]


@pytest.mark.slow  # a fresh starter: 6 s measured in a whole-suite run
def test_forked_workers_find_what_the_starter_preloaded():
    """A fresh fork (the first job's, and each replacement after a failure) already holds
    torch.distributed and torch._dynamo: without them each worker imported them itself, a
    first optimizer cost seconds per rank, and so did every job after a failure (a
    lint auto-fix once removed the 'unused' imports and nothing noticed)."""
    from distlab.launch.starter import PRELOADED

    assert {"torch.distributed", "torch._dynamo"} <= set(PRELOADED)
    launch.shutdown()
    assert distlab.run(_preloaded_before_the_job, 2, args=(PRELOADED,)) == [[], []]
    with pytest.raises(distlab.RankError):
        distlab.run(_exit_with, 2, args=(7,), timeout=60)
    assert distlab.run(_preloaded_before_the_job, 2, args=(PRELOADED,)) == [[], []]


def test_a_forked_worker_that_exits_reports_its_code_and_is_replaced_at_once():
    distlab.run(_parent_and_variable, 2)
    with pytest.raises(distlab.RankError) as info:
        distlab.run(_exit_with, 2, args=(7,), timeout=60)
    assert info.value.rank == 1 and "exited with code 7" in str(info.value)
    starter_pid = parent._starter.pid
    parents = {ppid for ppid, _ in distlab.run(_parent_and_variable, 2)}
    assert parents == {starter_pid}, "the replacements were forked by the same starter"


STARTER_ORPHAN_SCRIPT = """
import os, distlab
from distlab.launch import parent
ranks = distlab.run(lambda rank, world_size: os.getpid(), 2)
print(parent._starter.pid, *ranks, flush=True)
os._exit(0)  # no atexit: the pool and the starter are not shut down
"""


@pytest.mark.slow
def test_the_starter_and_its_workers_end_when_the_parent_dies(tmp_path):
    """Bounded by the work: the parent is gone at once; the starter notices within 0.5 s and
    its workers within 0.5 s more. 60 s leaves room for a loaded machine."""
    script = tmp_path / "orphans.py"
    script.write_text(textwrap.dedent(STARTER_ORPHAN_SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=True
    )
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 3
    end = time.monotonic() + 60
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "the starter or a worker outlived its parent"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_new_starter_right_after_shutdown_is_not_confused_with_the_old_one():
    """The old starter's goodbye (its workers ended, its socket closed) arrives while the new
    one forks: it must end only the old starter's workers and answer no new request."""
    for _ in range(3):
        launch.shutdown()
        parents = {ppid for ppid, _ in distlab.run(_parent_and_variable, 2)}
        assert parents == {parent._starter.pid}
        assert all(w.process.poll() is None for w in parent._idle), "a live worker was ended"
