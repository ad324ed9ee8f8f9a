"""Run a function on N real processes, from a notebook cell or a script.

``run(fn, world_size)`` is what ``torchrun`` does for a script, shrunk to
fit in a Jupyter cell:

1. the parent opens a rendezvous point, a ``torch.distributed.TCPStore`` on a
   free port that the operating system picks (so parallel runs never
   collide), and sets ``MASTER_ADDR``/``MASTER_PORT`` for the workers;
2. it ships ``fn`` *by value* to ``world_size`` worker processes with
   cloudpickle (a function defined in a notebook cell has no importable
   module, so plain pickle cannot send it);
3. each worker calls ``init_process_group(backend, rank=r, world_size=n)``
   against that store, runs ``fn(rank, world_size, *args)`` and sends back
   its return value, or its traceback if it raised;
4. the parent prints each rank's output prefixed with ``[rank r]``, returns
   the results in rank order, and if any rank fails (or the job runs past
   ``timeout``) kills every worker and raises one error naming the rank and
   saying what each other rank did (raised on its own, or failed because it stopped).

Workers stay warm between runs (torch already imported), so the second
launch in a notebook costs a fraction of a second; ``warm=False`` starts
fresh processes and ``shutdown()`` stops the pool.

Two details make it behave on a laptop. Each rank gets an equal share of the
CPU cores for torch's intra-op threads (``torch.set_num_threads``; four
ranks each using every core would fight over them; ``fn`` may call it again).
Workers run in their own session, so Ctrl+C (SIGINT, also what "interrupt
kernel" sends) reaches only the parent: it stops every worker of the job and
raises ``KeyboardInterrupt`` in the cell. A worker whose parent dies exits.
Each worker leads its own process group, and the launcher ends a worker by
killing that whole group, so processes a rank started (a ``subprocess`` it
forgot, a shell pipeline) end with it; a warm worker also ends them after each
job. A warm worker that died while idle is noticed before it gets a job (it
must answer a ping) and replaced. When a job runs past its timeout, every
unfinished rank's Python stack is read (``faulthandler`` on ``SIGUSR1``), so
:class:`LaunchTimeoutError` says where each rank was stuck.

Under ``torchrun`` the same worker code runs unchanged: call :func:`init`
at the top of the script and then ``fn(rank, world_size)``.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import NamedTuple

import cloudpickle

DEFAULT_TIMEOUT = 120.0
_MAX_IDLE_WORKERS = 8


# What a rank did in a failed job (RankError.outcomes).
RAISED = "raised"  # its own code raised
PEER_FAILED = "peer failed"  # a message to or from a rank that had stopped failed
DIED = "died"  # its process ended without a word (killed, out of memory, native crash)
FINISHED = "finished"  # it had returned its result
STOPPED = "stopped"  # it was still running when the launcher stopped the job


class RankOutcome(NamedTuple):
    """What one rank of a failed job did: ``status`` is one of RAISED, PEER_FAILED, DIED,
    FINISHED or STOPPED; ``error`` its ``"ExcType: first line"`` where it raised."""

    rank: int
    status: str
    error: str = ""

    def describe(self) -> str:
        what = {
            RAISED: f"raised {self.error}",
            PEER_FAILED: f"stopped because another rank failed ({self.error})",
            DIED: self.error,
            FINISHED: "had finished",
            STOPPED: "was still running; stopped",
        }[self.status]
        return f"rank {self.rank}: {what}"


class RankError(RuntimeError):
    """A rank raised. ``rank`` is the first rank that failed on its own, ``remote_traceback``
    its traceback; ``outcomes`` says what every rank did (see :class:`RankOutcome`);
    ``also_failed`` lists the other ranks that raised, on their own or because of it."""

    def __init__(
        self,
        rank: int,
        remote_traceback: str,
        exc_type: str,
        also_failed: tuple = (),
        outcomes: tuple[RankOutcome, ...] = (),
    ):
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type
        self.also_failed = tuple(also_failed)
        self.outcomes = tuple(outcomes)
        own = [o.rank for o in self.outcomes if o.status == RAISED and o.rank != rank]
        also = f" (ranks {own} raised errors of their own too)" if own else ""
        lines = [f"rank {rank} failed with {exc_type}; every rank was stopped{also}."]
        if len(self.outcomes) > 1:
            lines += [f"  {o.describe()}" for o in self.outcomes]
        lines.append(f"--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}")
        super().__init__("\n".join(lines))


class LaunchTimeoutError(TimeoutError):
    """The job ran past its timeout (often a deadlock: a rank waits for a message never sent).

    ``stuck`` maps each unfinished rank to where it was when the job was stopped
    (``"recv <- execute <- ring_all_reduce <- fn"``, innermost first), and
    ``stacks`` to its whole Python stack, as ``faulthandler`` printed it.
    """

    def __init__(self, message: str, stuck: dict | None = None, stacks: dict | None = None):
        super().__init__(message)
        self.stuck = dict(stuck or {})
        self.stacks = dict(stacks or {})


# ------------------------------------------------------------ wire messages ---
# What parent and workers send each other over their socket (pickled NamedTuples).
class Job(NamedTuple):
    """Parent -> worker: run ``payload`` (a cloudpickled ``(fn, args)``) as ``rank``."""

    rank: int
    world_size: int
    backend: str
    host: str
    port: int
    prefix: str  # TCPStore key prefix, unique per launch
    payload: bytes
    timeout: float
    cwd: str
    sys_path: list
    threads: int  # torch intra-op threads for this rank


class Ready(NamedTuple):
    """Worker -> parent: started and torch.distributed imported (and the answer to a
    :class:`Ping`). ``stack_file``: where the worker's stack goes on ``SIGUSR1``."""

    stack_file: str = ""


class Ping(NamedTuple):
    """Parent -> idle worker: are you alive? (answered with :class:`Ready`)."""


class Output(NamedTuple):
    """Worker -> parent: whole lines a rank printed, on ``stream`` ("stdout" or "stderr")."""

    stream: str
    text: str


class Result(NamedTuple):
    """Worker -> parent: ``fn`` returned; ``payload`` is its cloudpickled return value."""

    payload: bytes


class Failure(NamedTuple):
    """Worker -> parent: ``fn`` raised. ``peer_failed``: the error came from a message to or
    from a rank that had stopped (see :func:`_caused_by_peer`)."""

    exc_type: str
    traceback: str
    failed_at: float  # time.time() when it raised, to find which rank failed first
    peer_failed: bool
    summary: str  # "ExcType: first line of the message"


class _Died(NamedTuple):
    """Not sent: what the parent records for a worker whose process ended without a word.
    ``last_words``: what it wrote to its native stderr (gloo's abort message, say)."""

    exit_code: int | None
    last_words: str = ""


# ------------------------------------------------------------------ worker ---
class _RankOutput:
    """stdout/stderr inside a worker: sends whole lines to the parent, so the
    lines of different ranks never mix."""

    def __init__(self, conn: Connection, lock: threading.Lock, stream: str):
        self.conn, self.lock, self.stream = conn, lock, stream
        self.buffer = ""

    def write(self, text: str) -> int:
        self.buffer += text
        if "\n" in self.buffer:
            complete, _, self.buffer = self.buffer.rpartition("\n")
            self._send(complete + "\n")
        return len(text)

    def flush(self) -> None:
        if self.buffer:
            self._send(self.buffer)
            self.buffer = ""

    def _send(self, text: str) -> None:
        with self.lock:
            self.conn.send(Output(self.stream, text))

    def isatty(self) -> bool:
        return False


def _watch_parent(parent_pid: int) -> None:
    # No orphans: if the notebook kernel dies, its workers exit too, with what they started.
    while True:
        if os.getppid() != parent_pid:
            _end_started_processes()
            _remove_own_files()
            os._exit(1)
        time.sleep(0.5)


def _remove_own_files() -> None:
    """In a worker whose parent is gone: remove its stack file and native-stderr file (the
    parent would have, had it lived)."""
    paths = [_stack_out.name] if _stack_out is not None else []
    with contextlib.suppress(OSError):
        paths.append(os.readlink("/proc/self/fd/2"))
    for path in paths:
        if os.path.basename(path).startswith(("distlab-stack-", "distlab-stderr-")):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid``, read from ``/proc`` (empty where there is none)."""
    members = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:  # it ended while we looked
                continue
            if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp, ...
                members.append(int(entry))
    return members


def _end_started_processes() -> None:
    """In a worker: kill every other process of its group (what the job started)."""
    me = os.getpid()
    for pid in _group_members(os.getpgrp()):
        if pid != me:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


_stack_out = None  # the open file faulthandler writes to (kept alive here)


def _stack_file() -> str:
    """Register a faulthandler dump of this worker's threads on SIGUSR1; return its file.

    Opened for appending, so after the parent empties it a new dump starts at byte 0.
    """
    global _stack_out
    fd, path = tempfile.mkstemp(prefix="distlab-stack-", suffix=".txt")
    os.close(fd)
    _stack_out = open(path, "a")  # noqa: SIM115 - open for the life of the worker
    faulthandler.register(signal.SIGUSR1, file=_stack_out, all_threads=True)
    return path


def _worker_main(conn: Connection, parent_pid: int) -> None:
    """Loop: receive a job, run it, send the result. Runs in the spawned process."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl+C for the job
    if hasattr(signal, "pthread_sigmask"):  # started while the parent held SIGINT back
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    import torch.distributed as dist  # the expensive import, paid once per worker

    lock = threading.Lock()
    conn.send(Ready(_stack_file()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            _remove_own_files()
            return
        if job is None:
            return
        if isinstance(job, Ping):
            conn.send(Ready())
            continue
        saved = sys.stdout, sys.stderr
        sys.stdout = _RankOutput(conn, lock, "stdout")
        sys.stderr = _RankOutput(conn, lock, "stderr")
        try:
            reply = Result(cloudpickle.dumps(_run_job(dist, job)))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            failed_at = time.time()  # before peers notice: they fail a moment later
            reply = Failure(
                type(exc).__name__,
                traceback.format_exc(),
                failed_at,
                _caused_by_peer(exc),
                _summary(exc),
            )
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved
        with lock:
            conn.send(reply)
        if isinstance(reply, Failure):  # not reused: its process group state is unknown
            _stop_process_groups(dist)
            return


def _stop_process_groups(dist) -> None:
    """Destroy a failed rank's process groups before its process exits.

    Each gloo process group runs threads of its own (a ``gloo_tcp_loop`` transport thread
    and ``pt_gloo_runloop`` work threads; ``/proc/<pid>/task/*/comm`` names them). A
    worker that exited with them still running now and then aborted after Python's own
    shutdown, in C++ teardown: "terminate called without an active exception" on the
    notebook's stderr (notebook 03 with Exercise 5 unsolved: subgroups, then every rank
    raises). Once the failed function's frames are gone nothing else holds the groups, so
    destroying them joins those threads. If one is stuck in a message to a peer, the
    launcher kills this process a moment later anyway (it stops every worker of a failed job).
    """
    if not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # the process exits next; the parent has the error
        dist.destroy_process_group()  # every group: the default one and its subgroups


_PEER_GONE = (  # what gloo says when the rank at the other end of a message has stopped
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo/transport",
)


def _caused_by_peer(exc: BaseException) -> bool:
    """True if ``exc`` (or an error it was raised from) is a communication failure: a
    ``torch.distributed`` DistError or a gloo transport error, which is what a rank sees
    when a peer it exchanges messages with has stopped."""
    import torch.distributed as dist

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, dist.DistError) or any(m in str(exc) for m in _PEER_GONE):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_NATIVE_PLACE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")  # gloo's "[/path/pair.cc:537] "


def _summary(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    first = _NATIVE_PLACE.sub("", first)  # the reason, not the build path of the C++ file
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def _run_job(dist, job: Job):
    rank, world_size = job.rank, job.world_size
    os.environ.update(
        MASTER_ADDR=job.host,
        MASTER_PORT=str(job.port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    os.chdir(job.cwd)  # relative paths mean the same as in the caller
    import torch

    torch.set_num_threads(job.threads)
    sys.path[:] = job.sys_path  # so functions pickled by reference (from a module) resolve
    fn, args = cloudpickle.loads(job.payload)
    # Above the launcher's own timeout, so the launcher (which can say where every rank
    # is stuck) always ends a stuck job first, never gloo with a message blamed on a peer.
    timeout = timedelta(seconds=process_group_timeout(job.timeout))
    store = dist.TCPStore(job.host, job.port, world_size, is_master=False, timeout=timeout)
    store = dist.PrefixStore(job.prefix, store)
    kwargs = {}
    if job.backend == "nccl":
        torch.cuda.set_device(rank)
        kwargs["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(
        job.backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs
    )
    result = fn(rank, world_size, *args)  # if it raises, _worker_main stops the groups
    if dist.is_initialized():  # fn may have destroyed it itself, as a torchrun script does
        # Finish together: a rank whose fn returns at once (no messages) must not close
        # its connections while a slower peer is still opening them in init_process_group
        # ("connectFullMesh failed ... Connection closed by peer" on a busy machine).
        dist.barrier()
        dist.destroy_process_group()
    return result


def process_group_timeout(launch_timeout: float) -> float:
    """The workers' gloo/store timeout for a launch timeout: 1.5 times it, plus 30 s."""
    return 1.5 * launch_timeout + 30.0


# ------------------------------------------------------------------ parent ---
@dataclass
class _Worker:
    process: subprocess.Popen
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

    def kill(self) -> None:
        """Kill the worker's whole process group (it and whatever it started), then reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its group id is its pid
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


_idle: list[_Worker] = []
_pool_lock = threading.Lock()


def _start_worker() -> _Worker:
    """Start one worker with a plain ``python -c`` (not multiprocessing's spawn,
    which would re-import the caller's ``__main__`` script)."""
    parent_sock, child_sock = socket.socketpair()
    code = "import sys; from distlab.launch import _worker_entry; _worker_entry(int(sys.argv[1]), int(sys.argv[2]))"
    fd, native_stderr = tempfile.mkstemp(prefix="distlab-stderr-", suffix=".txt")
    os.close(fd)
    stderr = os.open(native_stderr, os.O_WRONLY | os.O_APPEND)
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", code, str(child_sock.fileno()), str(os.getpid())],
            pass_fds=(child_sock.fileno(),),
            stdin=subprocess.DEVNULL,
            stderr=stderr,  # relayed by the parent, and kept as the last words of a crash
            start_new_session=True,  # Ctrl+C in a terminal or notebook goes to the parent only
        )
    finally:
        os.close(stderr)
        child_sock.close()
    return _Worker(process, Connection(parent_sock.detach()), native_stderr=native_stderr)


def _worker_entry(fd: int, parent_pid: int) -> None:
    _worker_main(Connection(fd), parent_pid)


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
                fresh.append(_start_worker())
                workers.append(fresh[-1])
        for worker in fresh:  # wait until each new worker has imported torch
            _wait_ready(worker, deadline)
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers


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


def _wait_ready(worker: _Worker, deadline: float) -> None:
    if not worker.conn.poll(max(deadline - time.monotonic(), 0)):
        raise LaunchTimeoutError("worker processes did not start before the timeout")
    try:
        worker.stack_file = worker.conn.recv().stack_file
    except (EOFError, OSError):
        raise RuntimeError(
            f"a worker process died while starting (is distlab importable by {sys.executable}?)"
        ) from None


def _return_workers(workers: list[_Worker]) -> None:
    """Keep finished workers warm, unless the pool is full, the worker died, or its job
    left processes running (then the worker is retired with them: nothing outlives a job)."""
    with _pool_lock:
        for worker in workers:
            alive = worker.process.poll() is None
            started = [p for p in _group_members(worker.process.pid) if p != worker.process.pid]
            if len(_idle) < _MAX_IDLE_WORKERS and alive and not started:
                _idle.append(worker)
            else:
                worker.kill()


def shutdown() -> None:
    """Stop the warm worker pool (``run`` starts a new one when needed)."""
    with _pool_lock:
        while _idle:
            worker = _idle.pop()
            try:
                worker.conn.send(None)
            except OSError:
                pass
            worker.kill()


atexit.register(shutdown)


def threads_per_rank(world_size: int) -> int:
    """torch threads for each of ``world_size`` ranks: the usable cores shared out, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world_size)


def _check_arguments(fn, world_size: int, backend: str, timeout: float) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (GPUs), got {backend!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < world_size:
            raise ValueError(
                f"backend='nccl' gives each rank its own GPU: {world_size} ranks need "
                f"{world_size} GPUs but {gpus} {'is' if gpus == 1 else 'are'} visible. "
                "Use backend='gloo' to run on the CPU."
            )


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
    _check_arguments(fn, world_size, backend, timeout)
    import torch.distributed as dist

    deadline = time.monotonic() + timeout
    payload = cloudpickle.dumps((fn, tuple(args)))
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout),
    )
    workers: list[_Worker] = []
    prefix = f"distlab-{os.getpid()}-{time.monotonic_ns()}/"
    try:
        workers = _take_workers(world_size, warm, deadline)
        job = Job(
            rank=0,
            world_size=world_size,
            backend=backend,
            host="127.0.0.1",
            port=store.port,
            prefix=prefix,
            payload=payload,
            timeout=timeout,
            cwd=os.getcwd(),
            sys_path=list(sys.path),
            threads=threads_per_rank(world_size),
        )
        for rank, worker in enumerate(workers):
            worker.conn.send(job._replace(rank=rank))
        results = _collect(workers, deadline, timeout, show_output)
    except BaseException:
        _relay_native_output(workers, show_output)
        for worker in workers:
            worker.kill()
        raise
    finally:
        del store
    _relay_native_output(workers, show_output)
    if warm:
        _return_workers(workers)
    else:
        for worker in workers:
            worker.conn.send(None)
            worker.kill()
    return results


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
            message = _receive(workers[rank])
            if isinstance(message, Output):
                if show_output:
                    _print_rank_output(rank, message.stream, message.text)
            elif isinstance(message, Result):
                results[rank] = cloudpickle.loads(message.payload)
                pending.discard(rank)
            elif isinstance(message, Failure | _Died):
                finished = set(range(len(workers))) - pending
                raise _rank_error(workers, {rank: message}, finished)
    return results


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


def _timeout_error(workers: list[_Worker], pending: set[int], timeout: float):
    """A LaunchTimeoutError that says where each unfinished rank was stuck."""
    stacks = {rank: workers[rank].stack() for rank in sorted(pending)}
    stuck = {rank: where_stuck(stack) for rank, stack in stacks.items()}
    finished = sorted(set(range(len(workers))) - pending)
    lines = [
        f"job timed out after {timeout:g} s; ranks {sorted(pending)} had not finished"
        + (f" (ranks {finished} had)." if finished else "."),
        *[f"  rank {rank} was in {where}" for rank, where in stuck.items()],
        (
            "A common cause is a deadlock: a rank waiting for a message that is never sent "
            "(mismatched send/recv, or a collective that not every rank calls)."
        ),
    ]
    return LaunchTimeoutError("\n".join(lines), stuck, stacks)


def where_stuck(stack: str, depth: int = 5) -> str:
    """``"recv (file:line) <- execute <- ring_all_reduce <- fn"`` from a faulthandler dump of
    a worker: the thread running the job (the one that came from ``_worker_main``),
    innermost first, without the launcher's own frames."""
    for block in stack.split("\n\n"):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        names = [name for _, _, name in frames]
        if "_worker_main" not in names:
            continue
        frames = frames[: names.index("_run_job")] if "_run_job" in names else frames
        if not frames:
            return "the launcher (starting the process group)"
        path, line, name = frames[0]
        chain = [f"{name} ({os.path.basename(path)}:{line})"] + [f[2] for f in frames[1:depth]]
        return " <- ".join(chain) + (" <- ..." if len(frames) > depth else "")
    return "an unknown place (its stack could not be read)"


def _receive(worker: _Worker):
    try:
        return worker.conn.recv()
    except (EOFError, OSError):  # the process is gone without a word (closed or reset)
        code = worker.process.wait()
        return _Died(code, worker.native_output())


def _rank_error(workers: list[_Worker], failures: dict, finished: set[int]) -> RankError:
    """When one rank fails, its peers soon fail too ("connection closed by peer"), or fail
    on their own. Collect what arrives within a moment, say what each rank did, and blame
    the earliest rank that failed on its own; else a rank whose process died (its peers then
    fail only because it is gone); else the earliest to fail."""
    grace = time.monotonic() + 0.5
    while time.monotonic() < grace:
        waiting = {w.conn: r for r, w in enumerate(workers) if r not in failures.keys() | finished}
        for conn in wait(list(waiting), timeout=max(grace - time.monotonic(), 0)):
            message = _receive(workers[waiting[conn]])
            if isinstance(message, Failure | _Died):
                failures[waiting[conn]] = message
            elif isinstance(message, Result):
                finished.add(waiting[conn])
    outcomes = tuple(_outcome(r, failures.get(r), r in finished) for r in range(len(workers)))
    raised = {r: m for r, m in failures.items() if isinstance(m, Failure)}
    own = {r: m for r, m in raised.items() if not m.peer_failed}
    died = [r for r, m in failures.items() if isinstance(m, _Died)]
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


def _last_words(text: str, lines: int = 12) -> str:
    """The end of a dead rank's native stderr, for its error message ("" if it said nothing)."""
    tail = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "; its last words on stderr:\n" + "\n".join(tail) if tail else ""


def _outcome(rank: int, failure, finished: bool) -> RankOutcome:
    if isinstance(failure, Failure):
        return RankOutcome(rank, PEER_FAILED if failure.peer_failed else RAISED, failure.summary)
    if isinstance(failure, _Died):
        return RankOutcome(rank, DIED, f"its process exited with code {failure.exit_code}")
    return RankOutcome(rank, FINISHED if finished else STOPPED)


_line_start: dict[tuple[int, str], bool] = {}


def _print_rank_output(rank: int, stream: str, text: str) -> None:
    target = sys.stdout if stream == "stdout" else sys.stderr
    out = []
    for piece in text.splitlines(keepends=True):
        if _line_start.get((rank, stream), True):
            out.append(f"[rank {rank}] ")
        out.append(piece)
        _line_start[(rank, stream)] = piece.endswith("\n")
    target.write("".join(out))
    target.flush()


# --------------------------------------------------------------- torchrun ---
def init(backend: str | None = None, timeout: float = 1800.0) -> tuple[int, int]:
    """Initialise the process group from ``torchrun``'s environment; return ``(rank, world_size)``.

    torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
    ``MASTER_PORT``. The backend defaults to NCCL when CUDA is available (each
    process then uses GPU ``LOCAL_RANK``) and to gloo otherwise.
    """
    import torch
    import torch.distributed as dist

    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f"distlab.init() reads the environment set by torchrun, but {missing} "
            "are not set. Start the script with `torchrun --nproc-per-node N script.py`, "
            "or use distlab.run(fn, N) from Python."
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    kwargs = {}
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout), **kwargs)
    return dist.get_rank(), dist.get_world_size()
