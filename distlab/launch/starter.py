"""Start workers in milliseconds: fork them from one process that imported torch already.

A fresh worker spends about 2.5 s of CPU importing ``torch.distributed``. Four of them on
a 2-core laptop keep it busy for about 5 s before the job starts, and every job that fails
pays it again (a failed job's workers are not reused). On Linux the parent therefore keeps
one *starter* process: it imports ``torch.distributed`` once, then, for each worker the
parent asks for, forks a copy of itself that runs :func:`distlab.launch.worker.main`. A fork
shares the imported modules, so a worker is ready at once. Elsewhere (macOS, Windows: fork
is not safe there once native libraries are loaded), or when a variable that torch may read
at import time changed since the starter imported it (:data:`READ_AT_IMPORT`), each worker
is a fresh ``python`` as before (:func:`distlab.launch.parent._spawn_worker`); every other
variable reaches a fork as the parent has it when the worker starts.

The conversation, one JSON message per packet over a socket pair:

* the parent sends ``["start", stderr_path, environment]`` (JSON) and passes the worker's
  end of its own socket pair along (``SCM_RIGHTS``); the starter forks, waits until the
  child leads a session of its own, and answers ``["started", pid]``;
* the starter reaps its children and reports ``["ended", pid, exit code]``, with the exit
  code as :class:`subprocess.Popen` gives it (negative: killed by that signal);
* the starter exits when the parent dies or closes the socket; its workers then see
  their parent gone and exit too (they watch their parent, see
  :func:`distlab.launch.worker._watch_parent`).

The starter never runs torch code, so it holds no state a fork could copy half-way.
Before its first fork it also imports ``torch._dynamo``: a torch optimizer's constructor
loads it, and so does almost every job of the course. That is about 2.3 s of CPU, paid
once here rather than by every worker forked before it (a four-rank job's first optimizer
took 7 s on two cores, and so did the first job after every failure).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from distlab.core.processes import is_running, started_at

from .worker import main as worker_main

#: Forking is used only here; other systems start a fresh Python per worker.
CAN_FORK = sys.platform == "linux"

#: Prefixes of environment variables read when torch is imported, or when the process
#: starts: the native thread pools, the profiler's and torch's C++ and Python logging, the
#: loader, Python itself. A fork inherits the import the starter made; if one of these
#: changed since, a worker must import torch itself. Every other variable (the CUDA, NCCL
#: and gloo settings read when a device or a process group is first used, and the ones
#: torch sets for itself at run time, such as TORCHINDUCTOR_CACHE_DIR) reaches the fork as
#: it is now.
READ_AT_IMPORT = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "KINETO_", "TORCH_CPP_",
                  "TORCH_SHOW_CPP", "TORCH_LOGS", "LD_", "PYTHON")  # fmt: skip


def _read_at_import(environment=None) -> dict[str, str]:
    """The variables of ``environment`` (default: this process's) read at import."""
    environment = os.environ if environment is None else environment
    return {k: v for k, v in environment.items() if k.startswith(READ_AT_IMPORT)}


def import_refusal(variables: dict[str, str], loaded_with: dict[str, str]) -> str | None:
    """Why a fork of a process whose variables read at import were ``loaded_with`` would not
    be the import ``variables`` ask for (the names whose values differ), or None."""
    changed = sorted(
        k for k in {*variables, *loaded_with} if variables.get(k) != loaded_with.get(k)
    )
    return f"variables read at import differ: {changed}" if changed else None


#: Set by a process that hosts many kernels (:mod:`distlab.launch.template`): the path of
#: the socket where its template forks each kernel's starter.
TEMPLATE_ENV_VAR = "DISTLAB_STARTER_TEMPLATE"


def from_template(cwd: str) -> tuple[socket.socket, int] | None:
    """The kernel's side of :mod:`distlab.launch.template`: a starter forked by the
    template named in :data:`TEMPLATE_ENV_VAR`, as ``(socket, pid)``, or None when there
    is none, it refused or it is gone (the caller then starts a starter of its own). Waits
    while the template is still importing."""
    path = os.environ.get(TEMPLATE_ENV_VAR)
    if not CAN_FORK or not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
        hello = json.dumps(["starter", _read_at_import(), cwd]).encode()
        socket.send_fds(sock, [hello], [sys.__stdout__.fileno(), sys.__stderr__.fileno()])
        ready, _, _ = select.select([sock], [], [], 120)
        answer = json.loads(sock.recv(4096) or b"null") if ready else None
    except (OSError, ValueError, AttributeError):
        answer = None
    if not answer or answer[0] != "ready":
        sock.close()
        return None
    return sock, answer[1]


# ------------------------------------------------------------ the parent's side ---
class ForkedWorkerProcess:
    """The parent's handle on a worker the starter forked: what ``run`` uses of
    :class:`subprocess.Popen` (``pid``, ``poll``, ``wait``), fed by the starter's reports."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode

    def _end(self, code: int | None) -> None:
        self.returncode = code
        self._ended.set()


class ForkedStarterProcess:
    """A starter that a template forked (:mod:`distlab.launch.template`): not this
    process's child, so it is waited for by its process id, as much of
    :class:`subprocess.Popen` as :class:`Starter` uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self._started = started_at(pid)  # tells it from a later process given its pid

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while is_running(self.pid, self._started):
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"starter {self.pid}", timeout)
            time.sleep(0.02)
        return 0

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _Link:
    """One starter process as the parent sees it: its socket, the answers not yet taken,
    and the workers it forked that are still running."""

    def __init__(self, sock: socket.socket, process: subprocess.Popen, environment: dict):
        self.sock, self.process, self.environment = sock, process, environment
        self.answers: list[tuple[int | None, str | None]] = []  # (pid, or why not)
        self.workers: dict[int, ForkedWorkerProcess] = {}


class Starter:
    """The parent's link to its starter process (started on first use)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._link: _Link | None = None

    @property
    def pid(self) -> int | None:
        """The running starter's process id (None before it starts and after stop())."""
        link = self._link
        return link.process.pid if link else None

    def usable(self) -> bool:
        """True if forking is possible here, and no variable read when torch is imported
        (:data:`READ_AT_IMPORT`) changed since the starter imported it."""
        link = self._link
        return CAN_FORK and (link is None or _read_at_import() == link.environment)

    def start(self) -> None:
        """Start the starter process if it is not running (it imports torch meanwhile)."""
        with self._lock:
            if CAN_FORK and self._link is None:
                self._link = self._start_starter()

    def start_worker(self, child_sock: socket.socket, stderr_path: str) -> ForkedWorkerProcess:
        """Fork a worker that talks over ``child_sock`` and writes its native stderr to
        ``stderr_path``; return its process handle. The first call waits for the starter's
        own import of torch."""
        request = json.dumps(["start", stderr_path, dict(os.environ)]).encode()
        with self._lock:
            if self._link is None:
                self._link = self._start_starter()
            link = self._link
            try:
                socket.send_fds(link.sock, [request], [child_sock.fileno()])
            except OSError:  # it has just exited: one new starter, once
                link = self._link = self._start_starter()
                socket.send_fds(link.sock, [request], [child_sock.fileno()])
            while not link.answers:
                if not self._answered.wait(timeout=120):
                    raise RuntimeError("the worker starter did not answer within 120 s")
            pid, problem = link.answers.pop(0)
            if problem:
                raise RuntimeError(problem)
            link.workers[pid] = ForkedWorkerProcess(pid)
            return link.workers[pid]

    def _start_starter(self) -> _Link:
        forked = from_template(os.getcwd())  # a host's template forks one at once, if any
        if forked is not None:
            sock, pid = forked
            link = _Link(sock, ForkedStarterProcess(pid), _read_at_import())
            threading.Thread(target=self._read_reports, args=(link,), daemon=True).start()
            return link
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = "import sys; from distlab.launch.starter import main; main(int(sys.argv[1]))"
        environment = _read_at_import()
        process = subprocess.Popen(
            [sys.executable, "-c", code, str(child_sock.fileno())],
            pass_fds=(child_sock.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl+C goes to the parent only
        )  # lives as long as its parent, or until stop()
        child_sock.close()
        link = _Link(parent_sock, process, environment)
        threading.Thread(target=self._read_reports, args=(link,), daemon=True).start()
        return link

    def _read_reports(self, link: _Link) -> None:
        """Hand each ``started`` answer to the waiting request; end each reported worker.
        When the starter goes, its workers go too (they watch it): all count as ended."""
        while True:
            try:
                data = link.sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
            kind, *values = json.loads(data)
            with self._lock:
                if kind == "started":
                    link.answers.append((values[0], None))
                elif kind == "failed":
                    link.answers.append((None, f"forking a worker failed: {values[0]}"))
                elif kind == "ended" and values[0] in link.workers:
                    link.workers.pop(values[0])._end(values[1])
                self._answered.notify_all()
        with self._lock:
            if self._link is link:
                self._link = None
            for handle in link.workers.values():
                handle._end(STARTER_GONE)
            link.workers.clear()
            link.answers.append((None, "the worker starter exited"))
            self._answered.notify_all()
        link.sock.close()
        link.process.wait()

    def stop(self) -> None:
        """Close the link: the starter exits, and the workers it forked follow it."""
        with self._lock:
            link, self._link = self._link, None
        if link is None:
            return
        link.sock.shutdown(socket.SHUT_RDWR)
        try:
            link.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            link.process.kill()
            link.process.wait()


#: What the starter imports before its first fork, so every forked worker has it: what a
#: worker unpickles jobs with, what it runs on, and what every torch optimizer's
#: constructor imports (about 2.3 s of CPU each; tests/test_launch_starter.py checks a
#: fresh fork finds all three already imported).
PRELOADED = ("cloudpickle", "torch.distributed", "torch._dynamo")

#: The exit code given to workers whose starter exited before reporting theirs.
STARTER_GONE = -1


# ------------------------------------------------------------ the starter's side ---
def main(fd: int) -> None:
    """The starter process: import torch.distributed once, then fork workers on request,
    and report each one's end. Exits when its parent dies or closes the socket."""
    serve(socket.socket(fileno=fd), parent=os.getppid())


def serve(sock: socket.socket, parent: int | None) -> None:
    """The starter's loop on ``sock``: fork a worker per request, report each one's end;
    exit when ``sock`` is closed or, unless ``parent`` is None, when this process's parent
    is no longer ``parent``. (A starter forked by a template, :mod:`distlab.launch.template`,
    serves its kernel, not its parent: it ends when the kernel closes the socket.)"""
    wake_read, wake_write = wake_on_sigchld()  # to report ends at once
    for module in PRELOADED:  # imported for the forks: nothing here uses them
        importlib.import_module(module)

    while True:
        ready, _, _ = select.select([sock, wake_read], [], [], 0.5)
        if wake_read in ready:
            os.read(wake_read, 512)
        _report_ended(sock)
        if parent is not None and os.getppid() != parent:
            os._exit(0)
        if sock not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
        if not message:  # the parent closed the socket
            os._exit(0)
        _, stderr_path, environment = json.loads(message)
        leads_read, leads_write = os.pipe()  # closed by the child once it leads its session
        try:
            pid = os.fork()
        except OSError as error:
            _send(sock, ["failed", str(error)])
            for end in (fds[0], leads_read, leads_write):
                os.close(end)
            continue
        if pid == 0:
            os.close(leads_read)
            pipes = (wake_read, wake_write, leads_write)
            _become_worker(sock, pipes, fds[0], stderr_path, environment)
        os.close(fds[0])
        os.close(leads_write)
        os.read(leads_read, 1)  # the parent kills a worker by its group: it must exist first
        os.close(leads_read)
        _send(sock, ["started", pid])


def _become_worker(starter_sock, pipes, fd: int, stderr_path: str, environment) -> None:
    """In the forked child: the starter's signal set-up undone, a session of its own (its
    group id is then its pid, as for a worker started by ``Popen``; closing the last of
    ``pipes`` tells the starter so), the parent's environment of now, native stderr to its
    file, then the worker's loop, watching the starter."""
    code = 1
    try:
        forget_sigchld()
        starter_sock.close()
        os.setsid()
        for end in pipes:
            os.close(end)
        os.environ.clear()
        os.environ.update(environment)
        out = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
        os.dup2(out, 2)
        os.close(out)
        worker_main(fd, os.getppid())
        code = 0
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def wake_on_sigchld() -> tuple[int, int]:
    """A pipe that SIGCHLD writes to (``signal.set_wakeup_fd``): a loop that waits in
    ``select`` on its read end wakes up as soon as a child ends. Returns both ends."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_read, wake_write


def forget_sigchld() -> None:
    """Undo :func:`wake_on_sigchld` in a forked child (its pipe ends are closed apart)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def ended_children():
    """Reap every child that has ended: ``(pid, exit code)`` for each, the code as
    :class:`subprocess.Popen` gives it (negative: killed by that signal)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def _report_ended(sock: socket.socket) -> None:
    """Reap every child that has ended and tell the parent its exit code."""
    for pid, code in ended_children():
        _send(sock, ["ended", pid, code])


def _send(sock: socket.socket, message: list) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:  # the parent is gone
        os._exit(0)
