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
  token, in whatever session, and only then removes the temporary folder;
* and where the caller gets no way out at all (``kill -9``, the out-of-memory killer, a
  test run ended by an outer timeout), a watchdog started with the command
  (:func:`distlab.core.processes.start_watchdog`) ends every process with the token and
  removes the folder within a fraction of a second of the caller's death. Should the
  watchdog have died too, the next grade does it (:func:`clean_abandoned_runs`): each
  temporary folder names its owner's process and token.

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
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from distlab.core.processes import (
    descendants,
    end,
    is_running,
    start_watchdog,
    started_at,
    tagged,
)

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
    ended, and its temporary folder is gone, when this returns or raises, and within a
    second of this process's death if it dies first."""
    clean_abandoned_runs()
    token = uuid.uuid4().hex
    with (
        owned_folder(SCRATCH_PREFIX, token) as scratch,
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
        with signals_held():  # no Ctrl+C between starting the watchdog and the try
            watchdog = start_watchdog(TOKEN_VAR, token, list(_owned))
        try:
            process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                code = process.wait()
            finally:
                with signals_held():  # a Ctrl+C now waits until every process has ended
                    end_everything(process, token)
        finally:
            watchdog.release()
        log.seek(0)
        return code, log.read()


#: The temporary folders a grader makes: a grade's copy of the course, an exercise's run
#: folder, and one contained run's scratch (``TMPDIR``, Jupyter's runtime folder).
FOLDER_PREFIXES = ("distlab-grade-", "distlab-exercise-", "distlab-nbgrader-")
SCRATCH_PREFIX = "distlab-nbgrader-"
OWNER_FILE = "owner"  # in each of them: "PID START-TIME TOKEN" of the grader that made it
_owned: list[str] = []  # the folders this process holds now: its watchdogs remove them


@contextlib.contextmanager
def owned_folder(prefix: str, token: str = "-"):
    """A temporary folder (``prefix`` one of :data:`FOLDER_PREFIXES`) that names its owner:
    removed on the way out, by the watchdog of a contained run if this process dies within
    one, else by the next grade (:func:`clean_abandoned_runs`)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        (Path(folder) / OWNER_FILE).write_text(f"{os.getpid()} {started_at(os.getpid())} {token}")
        _owned.append(folder)
        try:
            yield folder
        finally:
            _owned.remove(folder)


def clean_abandoned_runs() -> list[str]:
    """End the processes and remove the temporary folders of every earlier grade whose
    grader died without cleaning up, and whose watchdog did not either; return the folders
    removed. A folder is abandoned when the process its owner file names is gone (or is
    another process with the same pid); folders of live graders are left alone."""
    removed = []
    for prefix in FOLDER_PREFIXES:
        for folder in Path(tempfile.gettempdir()).glob(prefix + "*"):
            try:
                pid, started, token = (folder / OWNER_FILE).read_text().split()
            except (OSError, ValueError):
                continue  # being written, or made by a release without owner files
            if is_running(int(pid), started):
                continue
            if token != "-":
                end(lambda token=token: tagged(TOKEN_VAR, token))
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


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
    first = descendants(process.pid)
    if process.poll() is None:
        first.add(process.pid)
    end(lambda: tagged(TOKEN_VAR, token), first)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # its group: what left both tree and tag
    process.wait()
