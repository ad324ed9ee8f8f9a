"""One worker process: wait for a job, run it as one rank, send back what happened.

The parent starts each worker as ``python -c "... main(fd, parent_pid)"`` (see
:mod:`distlab.launch.messages` for the conversation over ``fd``). The worker then:

1. watches its parent, and exits (ending whatever its jobs started) if the parent dies;
2. ignores Ctrl+C: the parent, which alone receives it, stops the job;
3. imports ``torch.distributed`` once (the expensive part, which a warm worker keeps), and
   registers a ``faulthandler`` dump of its stacks on ``SIGUSR1``, so a parent whose job
   timed out can ask where the rank was stuck;
4. for each job: joins the process group at the parent's ``TCPStore``, calls
   ``fn(rank, world_size, *args)`` with ``print`` sent to the parent line by line, and
   replies with the result or the traceback. A worker whose job raised exits after
   destroying its process groups, since their state is unknown; one whose job returned
   waits for the next.

The names ``_worker_main`` and ``_run_job`` also appear in the stack dumps that the parent
reads (``where_stuck``): the frames between them and the user's function are the launcher's.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import NamedTuple

import cloudpickle

from distlab.core.processes import end, group_members, tagged

from .messages import Failure, Job, Output, Ping, Ready, Result

_stack_out = None  # the open file faulthandler writes to (kept alive here)


def main(fd: int, parent_pid: int) -> None:
    """The worker process's entry point: ``fd`` is its end of the socket pair."""
    _worker_main(Connection(fd), parent_pid)


def _worker_main(conn: Connection, parent_pid: int) -> None:
    """Loop: receive a job, run it, send the result. Runs in the spawned process."""
    # Everything a job starts with exec inherits this tag, in whatever session it ends up:
    # the parent ends tagged processes with the worker (see parent._Worker.kill).
    os.environ[WORKER_TAG_VAR] = worker_tag(os.getpid())
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl+C for the job
    if hasattr(signal, "pthread_sigmask"):  # started while the parent held SIGINT back
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    import torch.distributed as dist  # the expensive import, paid once per worker

    global _channel
    lock = threading.Lock()
    _channel = JobChannel(conn, lock)
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
            reply = failure(exc)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved
        with lock:
            conn.send(reply)
        if isinstance(reply, Failure):  # not reused: its process group state is unknown
            _stop_process_groups(dist)
            return


def failure(exc: BaseException) -> Failure:
    """What the parent is told about ``exc``, which the job's function raised (call it in
    the ``except`` block: the traceback is the one being handled)."""
    failed_at = time.time()  # before peers notice: they fail a moment later
    summary = _summary(exc)
    return Failure(
        type(exc).__name__, traceback.format_exc(), failed_at, _caused_by_peer(exc), summary
    )


class JobChannel(NamedTuple):
    """A running job's own line to the parent: the worker's socket, which the worker loop
    does not read while a job runs. A job that talks with the parent as it runs (the ranks
    of :mod:`distlab.ranks`, which wait for notebook cells) sends and receives its own
    messages here; ``lock`` is the one the rank's printed lines are sent under, so that a
    message never lands in the middle of one."""

    conn: Connection
    lock: threading.Lock

    def send(self, message) -> None:
        with self.lock:
            self.conn.send(message)

    def recv(self):
        return self.conn.recv()


_channel: JobChannel | None = None  # set when the worker starts


def job_channel() -> JobChannel:
    """The running job's :class:`JobChannel` (only inside a function run by a worker)."""
    if _channel is None:
        raise RuntimeError("job_channel() works only in a function that a distlab worker runs")
    return _channel


def _watch_parent(parent_pid: int) -> None:
    # No orphans: if the notebook kernel dies, its workers exit too, with what they started.
    while True:
        if os.getppid() != parent_pid:
            _end_started_processes()
            _remove_own_files()
            os._exit(1)
        time.sleep(0.5)


def _end_started_processes() -> None:
    """In a worker: kill every other process of its group and every process with its tag
    (what its jobs started, in this session or another)."""
    tag = os.environ[WORKER_TAG_VAR]
    end(lambda: set(group_members(os.getpgrp())) | tagged(WORKER_TAG_VAR, tag))  # not itself


#: The environment variable that tags every process a worker's jobs start.
WORKER_TAG_VAR = "DISTLAB_LAUNCH_WORKER"


def worker_tag(worker_pid: int) -> str:
    """The tag of worker ``worker_pid``: its pid, unique among live processes (a process
    left by a dead worker whose pid a new worker got is ended with the new one's jobs,
    as it should have been with the old one's)."""
    return str(worker_pid)


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
        _finish_together(dist)
    return result


def _finish_together(dist) -> None:
    """The end-of-job barrier, after ``fn`` returned. A rank whose fn returns at once (no
    messages) must not close its connections while a slower peer is still opening them in
    init_process_group ("connectFullMesh failed ... Connection closed by peer" on a busy
    machine). Its own frame, so that a timeout can tell a rank waiting here (it finished)
    from one still running (:data:`FINISHED_FRAME`)."""
    dist.barrier()
    dist.destroy_process_group()


FINISHED_FRAME = _finish_together.__name__


def process_group_timeout(launch_timeout: float) -> float:
    """The workers' gloo/store timeout for a launch timeout: 1.5 times it, plus 30 s."""
    return 1.5 * launch_timeout + 30.0


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
