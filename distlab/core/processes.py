"""Find and end every process a job started, and do it even after the job's owner has died.

Two parts of distlab run code nobody controls: the grader runs a learner's notebook, and the
launcher's workers run a cell's function. Either may start processes of its own, some in a
session of their own (``setsid``, ``start_new_session=True``), which leave its process group,
and a process whose parent dies is re-parented to init and leaves its process tree. Three
ways to find them, read from ``/proc`` (from psutil elsewhere, if it is installed):

* :func:`descendants`: the process tree below a pid;
* :func:`group_members`: a process group;
* :func:`tagged`: every process whose environment carries ``VAR=value``. A process started
  with ``exec`` inherits its starter's environment, so a tag set by the owner follows
  everything below it, across sessions and re-parenting (a process that rewrites its
  children's environment from scratch escapes it; nothing else does).

:func:`end` stops, then kills, what a finder returns, and looks again until nothing is
left (a process may fork while we look).

An owner that is killed (``kill -9``, the out-of-memory killer, a terminal closed hard)
runs no clean-up code at all. :func:`start_watchdog` covers that case: a small Python
process in a session of its own blocks reading a pipe whose only writing end the owner
holds. When the owner exits, however it exits, the operating system closes that end, the
read returns, and the watchdog ends every process with the owner's tag and removes the
owner's scratch folder. An owner that finishes normally writes one byte first
(:meth:`Watchdog.release`) and the watchdog leaves without doing anything. The watchdog
runs this file as a script (``python -I processes.py``): it imports nothing but the
standard library, so it starts in about 20 ms.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

PROC = Path("/proc")
RELEASED = b"r"  # what an owner that finished normally writes to its watchdog


def parents() -> dict[int, int]:
    """pid -> parent pid of every live process (Linux ``/proc``; psutil elsewhere)."""
    if PROC.is_dir():
        found = {}
        for entry in PROC.iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if fields[0] != "Z":  # a zombie has already ended
                        found[int(entry.name)] = int(fields[1])
        return found
    try:
        import psutil
    except ImportError:
        return {}
    return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}


def started_at(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot ("-" where ``/proc`` has no
    answer, the process included): with the pid, it tells a process from a later one that
    was given the same pid."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "-"


def is_running(pid: int, started: str) -> bool:
    """Whether the process that :func:`started_at` described as ``started`` still runs
    (without ``/proc``: whether any process has that pid)."""
    if started != "-":
        return started_at(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for child, parent in parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid``, read from ``/proc`` (empty where there is none)."""
    members = []
    for entry in os.listdir(PROC) if PROC.is_dir() else ():
        if entry.isdigit():
            try:
                fields = (PROC / entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:  # it ended while we looked
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp, ...
                members.append(int(entry))
    return members


def tags(var: str) -> dict[int, str]:
    """pid -> value of ``var`` in the environment of every live process (of this user) that
    has it. One pass over ``/proc`` with plain ``os.read`` (about 15 microseconds a
    process: 6 ms for 400, paid once per warm launch)."""
    if not PROC.is_dir():
        return _tags_psutil(var)
    key = f"{var}=".encode()
    found = {}
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        environ = b"\0" + _read_all(f"/proc/{entry}/environ")  # b"" if not ours
        at = environ.find(b"\0" + key)  # NUL-separated VAR=value entries
        if at >= 0:
            value = environ[at + 1 + len(key) :].split(b"\0", 1)[0]
            found[int(entry)] = value.decode(errors="replace")
    return found


def _read_all(path: str) -> bytes:
    """The whole file at ``path``, or b"" if it cannot be read (it ended, or is not ours)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(chunks)


def tagged(var: str, value: str) -> set[int]:
    """Every live process (of this user) whose environment carries ``var=value``."""
    return {pid for pid, tag in tags(var).items() if tag == value}


def _tags_psutil(var: str) -> dict[int, str]:
    try:
        import psutil
    except ImportError:
        return {}
    found = {}
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            value = process.environ().get(var)
            if value is not None:
                found[process.pid] = value
    return found


def end(find: Callable[[], set[int]], first: set[int] = frozenset(), rounds: int = 100) -> None:
    """Stop, then kill, every process ``find()`` returns (and, the first time, those in
    ``first``), each with its process group (never the caller's own group, never the
    caller); look again until ``find()`` is empty."""
    alive = set(first) | find()
    for _ in range(rounds):
        alive -= {os.getpid()}
        if not alive:
            return
        for pid in alive:
            signal_quietly(pid, signal.SIGSTOP)  # a frozen process cannot start new ones
        for pid in alive:
            kill_group_and_process(pid)
        time.sleep(0.02)
        alive = find()


def signal_quietly(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid``, if it still exists and is ours."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def kill_group_and_process(pid: int) -> None:
    """SIGKILL ``pid`` and its process group, unless that group is the caller's."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        group = os.getpgid(pid)
        if group != os.getpgrp():
            os.killpg(group, signal.SIGKILL)
    signal_quietly(pid, signal.SIGKILL)


class Watchdog:
    """The owner's side of a watchdog: the pipe's writing end and the watchdog process."""

    def __init__(self, process: subprocess.Popen, fd: int):
        self.process, self.fd = process, fd

    def release(self) -> None:
        """The owner finished and ended what it started itself: tell the watchdog to leave
        everything as it is, and reap it."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self.fd, RELEASED)
        os.close(self.fd)
        self.fd = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def start_watchdog(var: str, value: str, folders: Sequence[str | os.PathLike] = ()) -> Watchdog:
    """Start a process that, when this one dies without :meth:`Watchdog.release`, ends
    every process tagged ``var=value`` and removes ``folders``. The watchdog itself runs
    without the tag, in a session of its own (a signal sent to this process's group or
    terminal does not reach it)."""
    read_fd, write_fd = os.pipe()  # both ends close-on-exec: no other child inherits them
    env = {k: v for k, v in os.environ.items() if k != var}
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", __file__, str(read_fd), var, value, *map(str, folders)],
            pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return Watchdog(process, write_fd)


def watch(fd: int, var: str, value: str, folders: Sequence[str]) -> None:
    """The watchdog: wait until the owner releases it or dies; if it died, end its tagged
    processes and remove its folders."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # a terminal's signals are the owner's to act on
    try:
        said = os.read(fd, 1)
    except OSError:
        said = b""
    if said == RELEASED:
        return
    end(lambda: tagged(var, value))
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:])
