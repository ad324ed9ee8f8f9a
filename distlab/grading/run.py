"""Run nbgrader (or one notebook) so that nothing it starts outlives it.

Grading runs a learner's code, and that code may start processes of its own (a
``subprocess.Popen``, the launcher's workers), some in a session of their own (the
Jupyter kernel always is). :func:`run_contained` therefore

* starts the command in a new session (its own process group), with stdin closed and
  its output in an unnamed temporary file, so no process it leaves behind holds the
  caller's terminal or pipe open;
* tags it with a token in its environment, inherited by every process it starts, and
  gives it a private ``TMPDIR`` and ``JUPYTER_RUNTIME_DIR`` (kernel connection files)
  inside a temporary folder;
* on every way out (it finished, failed, or the caller was interrupted) stops and then
  kills the command's process group, its process tree and every process that carries the
  token, in whatever session, and only then removes the temporary folder.

:func:`run_nbgrader` runs ``nbgrader ARGS`` that way, with :func:`nbgrader_env`, through
:mod:`distlab.grading.nbgrader_main` (several commands in one process, fixed costs cut).

Importing this module runs :func:`skip_unused_slow_imports`: an optional module that
grading never uses stays unloaded (3 s of CPU saved in every process that reads a notebook).

:func:`signals_raise` turns SIGINT, SIGTERM and SIGHUP into :class:`Interrupted`, so that
the ``finally`` blocks and ``TemporaryDirectory`` contexts run on those ways out too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

TOKEN_VAR = "DISTLAB_GRADE_RUN"
NBGRADER_MODULE = "distlab.grading.nbgrader_main"  # run as ``python -m NBGRADER_MODULE ARGS``
THEN = "--then"  # between two nbgrader commands of one NBGRADER_MODULE run
RESULTS = "--results"  # before them: FILE STUDENT ASSIGNMENT NOTEBOOK SUBMITTED

#: Modules that a library grading loads would import if installed, that grading never
#: uses, and that cost seconds to import: ``rfc3987_syntax`` compiles an Earley grammar
#: (about 3 s of CPU) when ``jsonschema`` loads, to check the "iri" string format;
#: ``nbformat`` loads ``jsonschema`` but validates notebooks without any format checker.
UNUSED_SLOW_MODULES = ("rfc3987_syntax",)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PROC = Path("/proc")


class Interrupted(Exception):
    """The grader received ``signum``; everything it started has been ended."""

    def __init__(self, signum: int):
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(f"Ctrl+C ({name})" if signum == signal.SIGINT else name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for Ctrl+C, 143 for SIGTERM


@contextlib.contextmanager
def signals_raise():
    """Within the block, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (once: later
    ones are ignored, so the clean-up that follows is not cut short)."""

    def handler(signum, frame):
        for stop in STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
        if _held:  # inside signals_held: raised when the block ends, not now
            _held[-1].append(signum)
            return
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can set handlers; there, signals keep their defaults
        return
    previous = {stop: signal.signal(stop, handler) for stop in STOP_SIGNALS}
    try:
        yield
    finally:
        for stop, action in previous.items():
            signal.signal(stop, action)


_held: list[list[int]] = []  # one list per open signals_held block: the signals it held back


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGHUP back within the block; they arrive after it.

    Two locks, because blocking a signal in this thread does not stop the kernel from
    delivering it to another thread of the process (a library's helper thread): the mask
    holds back signals aimed at this thread, and :func:`signals_raise`'s handler, which
    always runs in the main thread, records a signal that arrives anyway and it is
    raised as :class:`Interrupted` once the block is done.
    """
    masked = hasattr(signal, "pthread_sigmask")
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS) if masked else None
    _held.append([])
    try:
        yield
    finally:
        pending = _held.pop()
        if masked:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if pending:
        raise Interrupted(pending[0])


def run_contained(
    command: list[str], cwd: str | os.PathLike, env: dict[str, str]
) -> tuple[int, str]:
    """Run ``command``; return its exit code and output. Every process it started has
    ended, and its temporary folder is gone, when this returns or raises."""
    token = uuid.uuid4().hex
    with (
        tempfile.TemporaryDirectory(prefix="distlab-nbgrader-") as scratch,
        tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log,
    ):
        for sub in ("tmp", "runtime"):
            (Path(scratch) / sub).mkdir()
        env = {
            **env,
            TOKEN_VAR: token,
            "TMPDIR": str(Path(scratch) / "tmp"),
            "JUPYTER_RUNTIME_DIR": str(Path(scratch) / "runtime"),
        }
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            code = process.wait()
        finally:
            with signals_held():  # a Ctrl+C now waits until every process has ended
                end_everything(process, token)
        log.seek(0)
        return code, log.read()


def nbgrader_env() -> dict[str, str]:
    """The environment for nbgrader: this interpreter's ``bin`` first on PATH
    (nbgrader runs ``alembic`` to create the gradebook, and the kernel must be
    the Python that has distlab installed)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet debugger warning in kernels
    return env


def skip_unused_slow_imports() -> None:
    """Mark :data:`UNUSED_SLOW_MODULES` as not installed in this process (an import of one
    raises ImportError, which ``jsonschema`` expects and handles), unless already loaded."""
    for name in UNUSED_SLOW_MODULES:
        sys.modules.setdefault(name, None)


# Every grading process imports this module before nbformat: the package's __init__ loads
# it, and the children run as ``python -m distlab.grading.<module>``, which loads the
# package first. So the ``distlab grade`` command and its children all skip them.
skip_unused_slow_imports()


def run_nbgrader(course_dir: str | os.PathLike, *args: str) -> str:
    """Run ``nbgrader ARGS`` in ``course_dir``; return its log, raise RuntimeError on failure.

    ``ARGS`` may hold several commands separated by ``--then``: they run one after the other
    in one process (see :mod:`distlab.grading.nbgrader_main`). Every process it starts (the
    kernel, and whatever the notebook starts) has ended when this returns or raises: see
    :func:`run_contained`."""
    command = [sys.executable, "-m", NBGRADER_MODULE, *args]
    code, log = run_contained(command, course_dir, nbgrader_env())
    if code != 0:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed ({code}):\n{log}")
    return log


def end_everything(process: subprocess.Popen, token: str) -> None:
    """Stop, then kill, ``process``'s group, its tree and every process tagged with ``token``."""
    alive = descendants(process.pid) | tagged(token)
    if process.poll() is None:
        alive.add(process.pid)
    for _ in range(100):  # a process may fork while we look: look again until none is left
        alive -= {os.getpid()}
        if not alive:
            break
        for pid in alive:
            _signal(pid, signal.SIGSTOP)  # frozen processes cannot start new ones
        for pid in alive:
            _kill_group_and_process(pid)
        time.sleep(0.02)
        alive = tagged(token)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # its group: what left both tree and tag
    process.wait()


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _kill_group_and_process(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        group = os.getpgid(pid)
        if group != os.getpgrp():  # never the caller's own group
            os.killpg(group, signal.SIGKILL)
    _signal(pid, signal.SIGKILL)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process (Linux /proc; psutil elsewhere, if installed)."""
    if PROC.is_dir():
        parents = {}
        for entry in PROC.iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if fields[0] != "Z":  # a zombie has already ended
                        parents[int(entry.name)] = int(fields[1])
        return parents
    try:
        import psutil
    except ImportError:
        return {}
    return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def tagged(token: str) -> set[int]:
    """Every live process (of this user) whose environment carries ``token``."""
    mark = f"{TOKEN_VAR}={token}".encode()
    found = set()
    for pid in _parents():
        with contextlib.suppress(OSError):
            if mark in (PROC / str(pid) / "environ").read_bytes().split(b"\0"):
                found.add(pid)
    if not PROC.is_dir():
        found |= _tagged_psutil(mark.decode())
    return found


def _tagged_psutil(mark: str) -> set[int]:
    try:
        import psutil
    except ImportError:
        return set()
    name, value = mark.split("=", 1)
    found = set()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get(name) == value:
                found.add(process.pid)
    return found
