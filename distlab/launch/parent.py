"""The parent's side of ``run``: start or reuse workers, hand out a job, gather the results.

``run`` comes first, then ``start_job``, its first half (a job that talks with the parent
while it runs, such as :mod:`distlab.ranks`, starts with it alone); below them, the helpers
they call, in the order they call them: checking the arguments, taking warm workers from the
pool (or starting fresh ones),
collecting what the ranks send (their output, their results, or the failure that stops
every rank), relaying what native code wrote to each worker's stderr, and putting the
workers back in the pool. The messages are in :mod:`distlab.launch.messages`, what a
worker does with them in :mod:`distlab.launch.worker`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import NamedTuple

import cloudpickle

from distlab.core.checks import int_in, positive
from distlab.core.processes import end, group_members, tagged, tags

from .errors import (
    DIED,
    FINISHED,
    PEER_FAILED,
    RAISED,
    STOPPED,
    LaunchTimeoutError,
    RankError,
    RankOutcome,
)
from .messages import Failure, Job, Output, Ping, Ready, Result
from .starter import ForkedWorkerProcess, Starter
from .worker import FINISHED_FRAME, WORKER_TAG_VAR, process_group_timeout, worker_tag

DEFAULT_TIMEOUT = 120.0
_MAX_IDLE_WORKERS = 8

# The launcher's state, shared by every run of this process.
_idle: list[_Worker] = []  # the warm pool: workers waiting for their next job
_pool_lock = threading.Lock()
_starter = Starter()  # forks ready workers (Linux); started on first use
_line_start: dict[tuple[int, str], bool] = {}  # (rank, stream): is the next text a new line?


def run(
    fn,
    world_size: int,
    *,
    backend: str = "gloo",
    args: tuple = (),
    timeout: float = DEFAULT_TIMEOUT,
    warm: bool = True,
    show_output: bool = True,
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return results by rank.

    Each process has a ``torch.distributed`` process group initialised with
    ``backend`` (``"gloo"`` on CPU; ``"nccl"`` gives rank ``r`` GPU ``r``).
    Output printed by a rank appears prefixed with ``[rank r]``.

    Raises :class:`RankError` (naming the first rank that failed, with its
    traceback) if any rank raises or dies, and :class:`LaunchTimeoutError`
    if the job runs past ``timeout`` seconds; in both cases every worker of
    the job is killed first, so nothing is left behind.
    """
    job = start_job(fn, world_size, backend=backend, args=args, timeout=timeout, warm=warm)
    workers = job.workers
    try:
        results = _collect(workers, job.deadline, job.timeout, show_output)
    except BaseException:
        _relay_native_output(workers, show_output)
        job.kill()
        raise
    finally:
        job.store = None
    _relay_native_output(workers, show_output)
    if warm:
        _return_workers(workers)
    else:
        for worker in workers:
            worker.conn.send(None)
            worker.kill()
    return results


@dataclass
class StartedJob:
    """A job whose ranks are running: what :func:`start_job` returns. ``workers`` are in
    rank order; ``store`` is the rendezvous they joined, kept as long as the job runs (a
    subgroup the job creates meets there too); ``deadline`` is when ``timeout`` (checked,
    in seconds) ends, counted from the start (``time.monotonic()``)."""

    workers: list[_Worker]
    store: object
    timeout: float
    deadline: float

    def kill(self) -> None:
        """Kill every rank, with whatever it started (see :meth:`_Worker.kill`)."""
        for worker in self.workers:
            worker.kill()


def start_job(
    fn,
    world_size: int,
    *,
    backend: str = "gloo",
    args: tuple = (),
    timeout: float = DEFAULT_TIMEOUT,
    warm: bool = True,
) -> StartedJob:
    """Start ``fn(rank, world_size, *args)`` on ``world_size`` workers and return at once:
    the first half of :func:`run`, which then collects the results. A job that talks with
    the parent while it runs (:mod:`distlab.ranks`, ranks that run notebook cells) starts
    with it too, and reads its workers' messages with :func:`receive`. ``timeout`` bounds
    the start, and sets the process group's own timeout (:func:`process_group_timeout`)."""
    world_size, timeout, args = _check_arguments(fn, world_size, backend, timeout, args)
    import torch.distributed as dist

    deadline = time.monotonic() + timeout
    payload = cloudpickle.dumps((fn, tuple(args)))
    # The store's server runs in this process, which connects to it at once: that connection
    # is not the job's to time. It gets the workers' own store timeout (on a machine at load
    # 25 it took over 3 s, and the 3-second deadlock demo of notebook 00 failed with
    # DistNetworkError instead of the LaunchTimeoutError it shows); `deadline` times the job.
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=process_group_timeout(timeout)),
    )
    workers = _take_workers(world_size, warm, deadline)  # on any error it kills its own
    job = Job(
        rank=0,
        world_size=world_size,
        backend=backend,
        host="127.0.0.1",
        port=store.port,
        prefix=f"distlab-{os.getpid()}-{time.monotonic_ns()}/",
        payload=payload,
        timeout=timeout,
        cwd=os.getcwd(),
        sys_path=list(sys.path),
        threads=threads_per_rank(world_size),
    )
    try:
        for rank, worker in enumerate(workers):
            worker.conn.send(job._replace(rank=rank))
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return StartedJob(workers, store, timeout, deadline)


#: The most ranks ``run`` starts: each is a process on this machine (with torch loaded and
#: a gloo connection to every other rank); a larger job is a ``torchrun`` job on a cluster.
MAX_LOCAL_RANKS = 64
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # gloo's timeouts are timedeltas: inf or 1e300 s overflow


def _check_arguments(fn, world_size, backend: str, timeout, args) -> tuple[int, float, tuple]:
    """``(world_size, timeout, args)`` checked and normalised, or an error naming the bad one."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    world_size = int_in("world_size", world_size, 1, MAX_LOCAL_RANKS)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (GPUs), got {backend!r}")
    timeout = positive("timeout (seconds)", timeout)
    if timeout > MAX_TIMEOUT_S:
        raise ValueError(
            f"timeout (seconds) must be at most {MAX_TIMEOUT_S:.0f} (30 days), got {timeout:g}"
        )
    if not isinstance(args, (tuple, list)):
        raise TypeError(
            f"args must be a tuple of the extra arguments of fn, got {type(args).__name__} "
            f"{args!r}; for one argument write args=({args!r},)"
        )
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < world_size:
            raise ValueError(
                f"backend='nccl' gives each rank its own GPU: {world_size} ranks need "
                f"{world_size} GPUs but {gpus} {'is' if gpus == 1 else 'are'} visible. "
                "Use backend='gloo' to run on the CPU."
            )
    return world_size, timeout, tuple(args)


# ------------------------------------------------------------ taking workers ---
def _take_workers(n: int, warm: bool, deadline: float) -> list[_Worker]:
    """``n`` ready workers: idle ones from the pool that answer a ping, then fresh ones.
    On any error, Ctrl+C included, every worker taken or started here is killed."""
    workers: list[_Worker] = []
    try:
        with _pool_lock, _ctrl_c_deferred():
            while warm and _idle and len(workers) < n:
                workers.append(_idle.pop())
        answered = [_answers_ping(w, deadline) for w in workers]
        for worker, ok in zip(workers, answered):
            if not ok:
                worker.kill()  # died while idle (killed, out of memory, a laptop's sleep)
        workers = [w for w, ok in zip(workers, answered) if ok]
        fresh = []
        with _ctrl_c_deferred():
            for _ in range(n - len(workers)):
                fresh.append(_start_worker(fork=warm))
                workers.append(fresh[-1])
        for worker in fresh:  # wait until each new worker has imported torch
            _wait_ready(worker, deadline)
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers


@contextlib.contextmanager
def _ctrl_c_deferred():
    """Hold back SIGINT while processes start: a KeyboardInterrupt raised inside
    ``Popen`` would leave a started process that nobody knows about. The held
    signal is delivered on exit from the block, where the caller can clean up."""
    can_block = hasattr(signal, "pthread_sigmask")
    if can_block:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if can_block:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _answers_ping(worker: _Worker, deadline: float) -> bool:
    """True if an idle worker is alive: it answers a :class:`Ping` before the deadline."""
    if worker.process.poll() is not None:
        return False
    try:
        worker.conn.send(Ping())
        if not worker.conn.poll(max(min(deadline - time.monotonic(), 10.0), 0)):
            return False
        return isinstance(worker.conn.recv(), Ready)
    except (EOFError, OSError):
        return False


def _start_worker(fork: bool = True) -> _Worker:
    """Start one worker: forked by the starter, which imported torch already (Linux, see
    :mod:`distlab.launch.starter`), else (or with ``fork=False``: a cold run keeps no
    process, the starter included) a plain ``python -c`` (not multiprocessing's spawn,
    which would re-import the caller's ``__main__`` script)."""
    parent_sock, child_sock = socket.socketpair()
    fd, native_stderr = tempfile.mkstemp(prefix="distlab-stderr-", suffix=".txt")
    os.close(fd)
    try:
        if fork and _starter.usable():
            process = _starter.start_worker(child_sock, native_stderr)
        else:
            process = _spawn_worker(child_sock, native_stderr)
    finally:
        child_sock.close()
    return _Worker(process, Connection(parent_sock.detach()), native_stderr=native_stderr)


def _spawn_worker(child_sock: socket.socket, native_stderr: str) -> subprocess.Popen:
    """A worker as a fresh Python that imports torch itself."""
    code = (
        "import sys; from distlab.launch.worker import main; "
        "main(int(sys.argv[1]), int(sys.argv[2]))"
    )
    stderr = os.open(native_stderr, os.O_WRONLY | os.O_APPEND)
    try:
        return subprocess.Popen(
            [sys.executable, "-c", code, str(child_sock.fileno()), str(os.getpid())],
            pass_fds=(child_sock.fileno(),),
            stdin=subprocess.DEVNULL,
            stderr=stderr,  # relayed by the parent, and kept as the last words of a crash
            start_new_session=True,  # Ctrl+C in a terminal or notebook goes to the parent only
        )
    finally:
        os.close(stderr)


@dataclass
class _Worker:
    """The parent's handle on one worker process: its process, its end of the socket pair,
    and the two files it writes that the parent reads (stack dumps and native stderr)."""

    process: subprocess.Popen | ForkedWorkerProcess
    conn: Connection
    stack_file: str = ""
    native_stderr: str = ""  # the file its file descriptor 2 writes to (C++ included)
    stderr_read: int = 0  # bytes of it already relayed

    def native_output(self) -> str:
        """What the worker wrote to file descriptor 2 since the last call: lines from native
        code (gloo, c10) that bypass Python's ``sys.stderr``."""
        if not self.native_stderr:
            return ""
        try:
            with open(self.native_stderr, "rb") as f:
                f.seek(self.stderr_read)
                data = f.read()
        except OSError:
            return ""
        self.stderr_read += len(data)
        return data.decode("utf-8", errors="replace")

    @property
    def tag(self) -> str:
        """What the environment of every process its jobs started carries (``WORKER_TAG_VAR``)."""
        return worker_tag(self.process.pid)

    def kill(self) -> None:
        """Kill the worker's whole process group (it and whatever it started), and what its
        jobs started in sessions of their own (its tag), then reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its group id is its pid
        end(lambda: tagged(WORKER_TAG_VAR, self.tag))
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
            pass
        self.conn.close()
        for path in (self.stack_file, self.native_stderr):
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def stack(self, wait_s: float = 1.0) -> str:
        """The worker's Python stacks, dumped by faulthandler on SIGUSR1 ("" if unavailable)."""
        if not self.stack_file or self.process.poll() is not None:
            return ""
        with contextlib.suppress(OSError):
            os.truncate(self.stack_file, 0)
            os.kill(self.process.pid, signal.SIGUSR1)
            end = time.monotonic() + wait_s
            text = ""
            while time.monotonic() < end:
                time.sleep(0.05)
                with open(self.stack_file) as f:
                    now = f.read()
                if now and now == text:  # stopped growing: the dump is complete
                    return now
                text = now
            return text
        return ""


def _wait_ready(worker: _Worker, deadline: float) -> None:
    """Wait for a fresh worker's :class:`Ready`, and note where its stack dumps go."""
    if not worker.conn.poll(max(deadline - time.monotonic(), 0)):
        raise LaunchTimeoutError("worker processes did not start before the timeout")
    try:
        worker.stack_file = worker.conn.recv().stack_file
    except (EOFError, OSError):
        raise RuntimeError(
            f"a worker process died while starting (is distlab importable by {sys.executable}?)"
        ) from None


def threads_per_rank(world_size: int) -> int:
    """torch threads for each of ``world_size`` ranks: the usable cores shared out, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world_size)


# --------------------------------------------------------- collecting results ---
def _collect(workers: list[_Worker], deadline: float, timeout: float, show_output: bool) -> list:
    """Wait for every rank's result, streaming output; raise on the first failure."""
    results: list = [None] * len(workers)
    pending = set(range(len(workers)))
    rank_of = {w.conn: rank for rank, w in enumerate(workers)}
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timeout_error(workers, pending, timeout)
        for conn in wait([workers[r].conn for r in pending], timeout=remaining):
            rank = rank_of[conn]
            message = receive(workers[rank])
            if isinstance(message, Output):
                if show_output:
                    print_rank_output(rank, message.stream, message.text)
            elif isinstance(message, Result):
                results[rank] = cloudpickle.loads(message.payload)
                pending.discard(rank)
            elif isinstance(message, Failure | Died):
                finished = set(range(len(workers))) - pending
                raise _rank_error(workers, {rank: message}, finished)
    return results


def receive(worker: _Worker):
    """The worker's next message, or a :class:`Died` if its process is gone."""
    try:
        return worker.conn.recv()
    except (EOFError, OSError):  # the process is gone without a word (closed or reset)
        code = worker.process.wait()
        return Died(code, worker.native_output())


class Died(NamedTuple):
    """Not a message: what the parent records for a worker whose process ended without a
    word. ``last_words``: what it wrote to its native stderr (gloo's abort message, say)."""

    exit_code: int | None
    last_words: str = ""


def print_rank_output(rank: int, stream: str, text: str) -> None:
    """Print a rank's text on this process's ``stream``, each new line prefixed ``[rank r]``."""
    target = sys.stdout if stream == "stdout" else sys.stderr
    out = []
    for piece in text.splitlines(keepends=True):
        if _line_start.get((rank, stream), True):
            out.append(f"[rank {rank}] ")
        out.append(piece)
        _line_start[(rank, stream)] = piece.endswith("\n")
    target.write("".join(out))
    target.flush()


def _rank_error(workers: list[_Worker], failures: dict, finished: set[int]) -> RankError:
    """When one rank fails, its peers soon fail too ("connection closed by peer"), or fail
    on their own. Collect what arrives within a moment, say what each rank did, and blame
    the earliest rank that failed on its own; else a rank whose process died (its peers then
    fail only because it is gone); else the earliest to fail."""
    grace = time.monotonic() + 0.5
    while time.monotonic() < grace:
        waiting = {w.conn: r for r, w in enumerate(workers) if r not in failures.keys() | finished}
        for conn in wait(list(waiting), timeout=max(grace - time.monotonic(), 0)):
            message = receive(workers[waiting[conn]])
            if isinstance(message, Failure | Died):
                failures[waiting[conn]] = message
            elif isinstance(message, Result):
                finished.add(waiting[conn])
    outcomes = tuple(_outcome(r, failures.get(r), r in finished) for r in range(len(workers)))
    raised = {r: m for r, m in failures.items() if isinstance(m, Failure)}
    own = {r: m for r, m in raised.items() if not m.peer_failed}
    died = [r for r, m in failures.items() if isinstance(m, Died)]
    if own or (raised and not died):
        candidates = own or raised
        first = min(candidates, key=lambda r: candidates[r].failed_at)
        message = candidates[first]
        tb, exc_type = message.traceback, message.exc_type
    else:  # a process died: the peers' errors are only the echo of its going
        first = min(died)
        tb = (
            f"process exited with code {failures[first].exit_code} before returning a result "
            "(killed, out of memory, or a crash in native code)"
        ) + _last_words(failures[first].last_words)
        exc_type = "ProcessDied"
    also = sorted(r for r in failures if r != first)
    return RankError(first, tb, exc_type, also_failed=also, outcomes=outcomes)


def _outcome(rank: int, failure, finished: bool) -> RankOutcome:
    """What ``rank`` did: its :class:`Failure` or :class:`Died` if it sent one, else
    whether it had finished."""
    if isinstance(failure, Failure):
        return RankOutcome(rank, PEER_FAILED if failure.peer_failed else RAISED, failure.summary)
    if isinstance(failure, Died):
        return RankOutcome(rank, DIED, f"its process exited with code {failure.exit_code}")
    return RankOutcome(rank, FINISHED if finished else STOPPED)


def _last_words(text: str, lines: int = 12) -> str:
    """The end of a dead rank's native stderr, for its error message ("" if it said nothing)."""
    tail = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "; its last words on stderr:\n" + "\n".join(tail) if tail else ""


def _timeout_error(workers: list[_Worker], pending: set[int], timeout: float):
    """A LaunchTimeoutError that says where each unfinished rank was stuck, which ranks
    had returned and were waiting for the others, and which collective each rank was in
    when they were not all in the same one."""
    stacks = {rank: workers[rank].stack() for rank in sorted(pending)}
    stuck = {rank: where_stuck(stack) for rank, stack in stacks.items()}
    collectives = {rank: collective_in(stack) for rank, stack in stacks.items()}
    returned = sorted(r for r, where in collectives.items() if where == IN_FINAL_BARRIER)
    running = sorted(pending - set(returned))
    finished = sorted(set(range(len(workers))) - set(running))
    lines = [
        f"job timed out after {timeout:g} s; ranks {running} had not finished"
        + (f" (ranks {finished} had)." if finished else "."),
        *[f"  rank {rank} was in {stuck[rank]}" for rank in running],
        *[
            f"  rank {rank} had returned from its function and was waiting for the others "
            "in the end-of-job barrier"
            for rank in returned
        ],
    ]
    if len(set(collectives.values())) > 1:
        named = "; ".join(f"rank {r}: {c or 'no collective'}" for r, c in collectives.items())
        lines.append(
            f"The ranks were not in the same collective ({named}): every rank of a group must "
            "call the same collective, with the same algorithm (distlab's own and torch's "
            "built-in do not talk to each other)."
        )
    lines.append(
        "A common cause is a deadlock: a rank waiting for a message that is never sent "
        "(mismatched send/recv, or a collective that not every rank calls)."
    )
    return LaunchTimeoutError("\n".join(lines), stuck, stacks, collectives)


def job_frames(stack: str) -> list[tuple[str, str, str]] | None:
    """(file, line, function) of the thread running the job in a faulthandler dump of a
    worker, innermost first, down to the launcher's ``_run_job`` (None if not found)."""
    for block in stack.split("\n\n"):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        names = [name for _, _, name in frames]
        if "_worker_main" in names:
            return frames[: names.index("_run_job")] if "_run_job" in names else frames
    return None


def where_stuck(stack: str, depth: int = 5) -> str:
    """``"recv (file:line) <- execute <- ring_all_reduce <- fn"`` from a faulthandler dump of
    a worker: the thread running the job (the one that came from the worker's
    ``_worker_main``), innermost first, without the launcher's own frames (``_run_job`` and
    below it)."""
    frames = job_frames(stack)
    if frames is None:
        return "an unknown place (its stack could not be read)"
    if not frames:
        return "the launcher (starting the process group)"
    path, line, name = frames[0]
    chain = [f"{name} ({os.path.basename(path)}:{line})"] + [f[2] for f in frames[1:depth]]
    return " <- ".join(chain) + (" <- ..." if len(frames) > depth else "")


IN_FINAL_BARRIER = "the end-of-job barrier (its function had returned)"


def collective_in(stack: str) -> str:
    """The collective the job's thread was in, from its outermost frame in one:
    ``"distlab's ring_all_reduce"`` (a function of :mod:`distlab.collectives`),
    ``"torch.distributed.all_reduce"`` (a function of torch's ``distributed_c10d``), the
    end-of-job barrier, or "" for none."""
    frames = job_frames(stack) or []
    for path, _, name in reversed(frames):  # outermost first: the call the job made
        if name == FINISHED_FRAME:
            return IN_FINAL_BARRIER
        if f"{os.sep}distlab{os.sep}collectives{os.sep}" in path:
            return f"distlab's {name}"
        if path.endswith("distributed_c10d.py"):
            return f"torch.distributed.{name}"
    return ""


# ------------------------------------------------------------ after the job ---
def _relay_native_output(workers: list[_Worker], show_output: bool) -> None:
    """Pass on what each rank's native code wrote to stderr, labelled by rank, to this
    process's own file descriptor 2, where it went before workers had a file of their own:
    a terminal shows it, a notebook kernel logs it (it is not a cell's stderr, which
    nbgrader would count as a failed test). A dead rank's lines also go into its RankError."""
    for rank, worker in enumerate(workers):
        text = worker.native_output()
        if text and show_output:
            lines = text if text.endswith("\n") else text + "\n"
            labelled = "".join(f"[rank {rank}] {line}" for line in lines.splitlines(keepends=True))
            with contextlib.suppress(OSError):
                os.write(2, labelled.encode("utf-8", errors="replace"))


def _return_workers(workers: list[_Worker]) -> None:
    """Keep finished workers warm, unless the pool is full, the worker died, or its job
    left processes running, in its process group or (tagged) in a session of their own:
    then the worker is retired with them, for nothing outlives a job."""
    tagged_now = set(tags(WORKER_TAG_VAR).values())  # one pass over /proc for all of them
    with _pool_lock:
        for worker in workers:
            alive = worker.process.poll() is None
            in_group = [p for p in group_members(worker.process.pid) if p != worker.process.pid]
            left_running = bool(in_group) or worker.tag in tagged_now
            if len(_idle) < _MAX_IDLE_WORKERS and alive and not left_running:
                _idle.append(worker)
            else:
                worker.kill()


def prestart() -> None:
    """Start the worker starter now, without waiting for it (Linux; elsewhere nothing):
    the first ``run`` then finds torch imported, if it comes a couple of seconds later.
    The grader calls it while the notebook's kernel imports its modules."""
    _starter.start()


def shutdown() -> None:
    """Stop the warm worker pool and the starter (``run`` starts new ones when needed)."""
    with _pool_lock:
        while _idle:
            worker = _idle.pop()
            try:
                worker.conn.send(None)
            except OSError:
                pass
            worker.kill()
        _starter.stop()


atexit.register(shutdown)
