"""Fork each kernel's worker starter, and the grader's kernels, from one process that imported torch once.

Every process that calls ``distlab.run`` keeps a *starter* (:mod:`distlab.launch.starter`):
a fresh Python that imports torch.distributed and torch._dynamo (about 5 s of CPU on a
2-core laptop) and then forks the workers. Grading starts many kernels one after the
other (nbgrader a kernel per notebook, ``distlab grade --exercise`` a kernel per
exercise), so each of them paid those 5 s again for its own starter.

A process that hosts many kernels therefore starts one **template** first
(:func:`start_template`): it imports what a starter imports, listens on a Unix socket,
and puts the socket's path in ``$DISTLAB_STARTER_TEMPLATE``
(:data:`~distlab.launch.starter.TEMPLATE_ENV_VAR`), which the kernels inherit. When a
kernel needs its starter (:class:`distlab.launch.starter.Starter`) it connects there
instead of starting a Python (:func:`distlab.launch.starter.from_template`, the kernel's
side), and the template forks a copy of itself that becomes that kernel's starter. Each
kernel still has a starter of its own, which forks its workers and ends with it; only the
import is shared. The conversation:

* the kernel sends ``["starter", variables, cwd]`` (JSON: the variables torch reads when
  it is imported, :data:`distlab.launch.starter.READ_AT_IMPORT`, and its working folder)
  with its own stdout and stderr (``SCM_RIGHTS``);
* the template answers ``["refused", why]`` when one of those variables differs from its
  own (its import would not be the one the kernel's own starter would make), and the
  kernel starts a Python of its own as before; otherwise it forks, and the child takes
  the kernel's stdout, stderr and folder, answers ``["ready", pid]`` and runs the
  starter's loop (:func:`distlab.launch.starter.serve`) on the same socket. The starter
  exits when the kernel closes it (the kernel ended, however), and its workers follow.

The same template forks the host's grading **kernels** too (:mod:`distlab.grading.forked_kernel`):
a kernel manager set up for it sends ``["kernel", command, environment, cwd]`` with the
kernel's stdin, stdout and stderr; the template answers ``["refused", why]`` (the kernel then
starts the usual way) or forks, sends ``["forked", pid]`` with a pidfd of the child, and
keeps the socket to report ``["exited", code]`` when it reaps it. The child becomes the
kernel (:mod:`distlab.launch.kernel_child`), which finds torch imported.

The template exits when the process that started it ends (the kernels it forked die with
it); if that process was killed before it could clean up, the template removes its socket
(and the folder :func:`hosting` made for it, once empty) on its way out. Linux only, as the
starter.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import kernel_child
from .starter import (
    CAN_FORK,
    PRELOADED,
    TEMPLATE_ENV_VAR,
    _read_at_import,
    ended_children,
    forget_sigchld,
    import_refusal,
    serve,
    wake_on_sigchld,
)

SOCKET_NAME = "starter-template.sock"

#: The longest Unix socket path used: ``sun_path`` holds 108 bytes on Linux, 104 on macOS.
MAX_SOCKET_PATH = 100


# ------------------------------------------------------------------ the host's side ---
def start_template(folder: str | os.PathLike) -> subprocess.Popen | None:
    """Start a template listening in ``folder`` (a private folder of the host's, whose
    path is short enough for a Unix socket) and set ``$DISTLAB_STARTER_TEMPLATE`` in this
    process's environment, for the kernels it starts next; None where forking is not used. The
    template imports torch meanwhile and exits when this process does."""
    if not CAN_FORK:
        return None
    path = Path(folder) / SOCKET_NAME
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))  # bound and listening before any kernel may connect
    listener.listen(16)
    code = "import sys; from distlab.launch.template import main; main(int(sys.argv[1]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(listener.fileno())],
        pass_fds=(listener.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    listener.close()
    os.environ[TEMPLATE_ENV_VAR] = str(path)
    return process


def stop_template(process: subprocess.Popen | None) -> None:
    """End a template from :func:`start_template` (the starters it forked end with their
    kernels) and unset ``$DISTLAB_STARTER_TEMPLATE``."""
    os.environ.pop(TEMPLATE_ENV_VAR, None)
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()


@contextlib.contextmanager
def hosting(wanted: bool = True) -> Iterator[None]:
    """Inside the block, the kernels this process starts fork their starters from one
    template (if ``wanted``; a host of a single kernel gains nothing from one). Unwanted,
    the block runs without any template, not even one this process inherited the path of:
    a contained grading run (:mod:`distlab.grading.run`) keeps every process it starts
    inside itself, starters included."""
    if not wanted:
        inherited = os.environ.pop(TEMPLATE_ENV_VAR, None)
        try:
            yield
        finally:
            if inherited is not None:
                os.environ[TEMPLATE_ENV_VAR] = inherited
        return
    folder = _socket_folder()
    if folder is None:  # no folder with a path short enough for a socket: no template
        with hosting(False):
            yield
        return
    process = start_template(folder)
    try:
        yield
    finally:
        stop_template(process)
        shutil.rmtree(folder, ignore_errors=True)


def _socket_folder() -> str | None:
    """A fresh private folder for the template's socket, in the temporary folder, or in
    ``/tmp`` where that one's path is too long for a Unix socket (a grading run's own
    temporary folder can be); None where neither is short enough."""
    for parent in (tempfile.gettempdir(), "/tmp"):
        room = len(os.fsencode(os.path.join(parent, "distlab-template-12345678", SOCKET_NAME)))
        if room <= MAX_SOCKET_PATH and os.path.isdir(parent):
            return tempfile.mkdtemp(prefix="distlab-template-", dir=parent)
    return None


# --------------------------------------------------------------- the template's side ---
def main(fd: int) -> None:
    """The template: import what a starter imports, then fork one starter per kernel that
    connects (its variables read at import time equal to this process's), reap them, and
    exit when the host process ends."""
    listener = socket.socket(fileno=fd)
    host = os.getppid()
    wake_read, wake_write = wake_on_sigchld()  # to reap the starters as they end
    for module in PRELOADED:
        importlib.import_module(module)
    no_kernels = kernel_child.prepare()  # why kernels cannot be forked here, or None
    mine = _read_at_import()
    kernels: dict[int, socket.socket] = {}  # a forked kernel's pid -> where its exit goes
    while True:
        ready, _, _ = select.select([listener, wake_read], [], [], 0.5)
        if wake_read in ready:
            os.read(wake_read, 512)
        for pid, code in ended_children():  # a starter's exit code: nobody waits for it
            if pid in kernels:
                conn = kernels.pop(pid)
                _answer(conn, ["exited", code])
                conn.close()
        if os.getppid() != host:  # the host ended; if it was killed, nobody cleaned up
            _remove_socket(listener)
            os._exit(0)  # the kernels forked here die with this process (PR_SET_PDEATHSIG)
        if listener not in ready:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        fds: list[int] = []
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
            request = json.loads(message)
            if request[0] == "kernel":
                inherited = (listener, (wake_read, wake_write), kernels)
                pid = _fork_kernel(no_kernels, request, fds, mine, conn, inherited)
                if pid is not None:
                    kernels[pid] = conn
                    conn = None  # kept open: the kernel's exit code goes there
            else:
                _, variables, cwd = request
                why = import_refusal(variables, mine)
                if why is None and len(fds) != 2:
                    why = f"{len(fds)} standard streams given, not 2"
                if why is not None:
                    _answer(conn, ["refused", why])
                elif os.fork() == 0:
                    _close_kernel_sockets(kernels)
                    _become_starter(listener, (wake_read, wake_write), conn, fds, cwd)
        except (OSError, ValueError, TypeError, AttributeError, IndexError) as error:
            _answer(conn, ["refused", str(error)])  # garbled, or no fork
        for end in fds:
            os.close(end)
        if conn is not None:
            conn.close()


def _close_kernel_sockets(kernels: dict[int, socket.socket]) -> None:
    """In a forked child: close its copies of the sockets the forked kernels' exit codes
    go to (only the template answers there)."""
    for conn in kernels.values():
        conn.close()


def _fork_kernel(no_kernels, request, fds, mine, conn, inherited) -> int | None:
    """Answer a ``["kernel", cmd, env, cwd]`` request (fds: the kernel's stdin, stdout
    and stderr): fork the kernel and send ``["forked", pid]`` with a pidfd of it, or
    ``["refused", why]``. The pid when forked. ``inherited``: the template's listener,
    wake-up pipe and kernel sockets, closed in the child."""
    _, cmd, env, cwd = request
    why = no_kernels or kernel_child.refusal(cmd, env, mine)
    if why is None and len(fds) != 3:
        why = f"{len(fds)} standard streams given, not 3"
    if why is None and _hung_up(conn):
        why = "the asker has gone"  # it stopped waiting (a busy machine): it starts its own
    if why is not None:
        _answer(conn, ["refused", why])
        return None
    pid = os.fork()
    if pid == 0:
        listener, pipes, kernels = inherited
        try:
            listener.close()
            conn.close()
            _close_kernel_sockets(kernels)
            forget_sigchld()
            for end in pipes:
                os.close(end)
            # ends in SystemExit, through the interpreter's shutdown, as a kernel's own exit
            kernel_child.become_kernel(cmd, env, cwd, fds)
        except Exception:  # noqa: BLE001 - whatever it was, the child must not become a template
            import traceback

            traceback.print_exc()
            os._exit(1)
    pidfd = os.pidfd_open(pid)  # before this loop may reap it: it can only name the kernel
    try:
        socket.send_fds(conn, [json.dumps(["forked", pid]).encode()], [pidfd])
    except OSError:  # the asker left meanwhile and starts a kernel of its own: not two
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        raise
    finally:
        os.close(pidfd)
    return pid


def _hung_up(conn: socket.socket) -> bool:
    """Whether the other end of ``conn`` has closed (its request may still be queued)."""
    poller = select.poll()
    poller.register(conn, select.POLLRDHUP)
    return any(events & (select.POLLRDHUP | select.POLLHUP) for _, events in poller.poll(0))


def _remove_socket(listener: socket.socket) -> None:
    """Remove the socket file and its folder, if that is now empty (``os.rmdir`` removes
    nothing else): a host that was killed left both behind."""
    path = listener.getsockname()
    with contextlib.suppress(OSError):
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def _become_starter(listener, pipes, conn: socket.socket, fds, cwd: str) -> None:
    """In the forked child: the template's socket and signal set-up dropped, the kernel's
    stdout, stderr and folder taken, then the starter's loop on ``conn``."""
    code = 1
    try:
        listener.close()
        forget_sigchld()
        for end in pipes:
            os.close(end)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.chdir(cwd)
        _answer(conn, ["ready", os.getpid()])
        serve(conn, parent=None)
        code = 0
    finally:
        os._exit(code)


def _answer(conn: socket.socket, message: list) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass
