"""distlab.core.processes: what an owner starts ends when the owner dies, however it dies.

Each test runs an "owner" in a subprocess that starts a watchdog and a tagged ``sleep`` in
a session of its own (out of the owner's process group and, once the owner is dead, out of
its process tree), then kills the owner with SIGKILL, which runs no clean-up code at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from distlab.core import processes

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")

VAR = "DISTLAB_TEST_OWNER"
OWNER = """\
import os, subprocess, sys, time
from distlab.core.processes import start_watchdog
var, tag, folder, release = sys.argv[1:]
watchdog = start_watchdog(var, tag, [folder])
sleeper = subprocess.Popen(["sleep", "600"], env={**os.environ, var: tag}, start_new_session=True)
print(sleeper.pid, watchdog.process.pid, flush=True)
if release == "release":
    watchdog.release()
    sys.exit(0)
time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _owner(tmp_path: Path, release: bool) -> tuple[subprocess.Popen, int, int, Path]:
    folder = tmp_path / "scratch"
    folder.mkdir()
    tag = uuid.uuid4().hex
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, VAR, tag, str(folder), "release" if release else "wait"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    sleeper, watchdog = map(int, owner.stdout.readline().split())
    return owner, sleeper, watchdog, folder


def _wait_until(condition, what: str) -> None:
    # The watchdog acts the moment the pipe closes (milliseconds); 60 s is headroom for a
    # machine under load, not an expected duration.
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_killed_owners_tagged_processes_and_folder_go_with_it(tmp_path):
    owner, sleeper, watchdog, folder = _owner(tmp_path, release=False)
    assert _alive(sleeper) and os.getsid(sleeper) == sleeper, "the sleeper leads a session"
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    _wait_until(lambda: not _alive(sleeper), "the tagged process outlived its owner")
    _wait_until(lambda: not folder.exists(), "the owner's folder was left")
    _wait_until(lambda: not _alive(watchdog), "the watchdog stayed")


def test_a_released_watchdog_leaves_everything_as_it_is(tmp_path):
    owner, sleeper, watchdog, folder = _owner(tmp_path, release=True)
    try:
        assert owner.wait(timeout=60) == 0
        _wait_until(lambda: not _alive(watchdog), "the released watchdog stayed")
        assert _alive(sleeper) and folder.exists()
    finally:
        os.kill(sleeper, signal.SIGKILL)


def test_end_kills_what_the_finder_returns_until_it_returns_nothing():
    tag = uuid.uuid4().hex
    env = {**os.environ, VAR: tag}
    # a shell that restarts its child once when killed would be a race; a tagged tree is not
    tree = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"], env=env)
    _wait_until(lambda: len(processes.tagged(VAR, tag)) == 3, "the tagged tree never started")
    processes.end(lambda: processes.tagged(VAR, tag))
    tree.wait(timeout=60)
    assert processes.tagged(VAR, tag) == set()
    assert processes.tags(VAR) == {}, "no other process carries the variable"


def test_the_watchdog_runs_with_the_standard_library_only():
    """It runs this file as a script (``python -I``), so a distlab import there would fail."""
    source = Path(processes.__file__).read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in imports if "distlab" in line or line.startswith("from .")]
