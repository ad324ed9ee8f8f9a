"""What the parent (the notebook or script that called ``run``) and a worker say to each other.

They share one socket pair (a ``multiprocessing.connection.Connection`` on each end), and
every message is one of the NamedTuples below, pickled by ``Connection.send``. What a
message carries that plain pickle cannot send (the user's function, its return value) is
already cloudpickled into ``bytes``.

The conversation, in order:

1. the parent starts the worker process; the worker imports ``torch.distributed`` and
   sends :class:`Ready` with the file its Python stack goes to on ``SIGUSR1``;
2. an idle worker waits for one of three things from the parent:

   - :class:`Ping`: "are you still alive?", sent before a warm worker gets a job; the
     worker answers :class:`Ready` (with no stack file: the parent already knows it);
   - ``None``: exit (``shutdown()``, or the end of a ``warm=False`` job);
   - :class:`Job`: run a function as one rank;

3. while a job runs, the worker sends :class:`Output` for every whole line the rank
   prints, then exactly one :class:`Result` (the function returned) or :class:`Failure`
   (it raised); after a failure the worker exits instead of waiting for another job;
4. a worker whose process ends without sending either (killed, out of memory, a crash in
   native code) just closes its end of the socket: the parent notices the closed
   connection and reads the worker's exit code itself.
"""

from __future__ import annotations

from typing import NamedTuple


class Ready(NamedTuple):
    """Worker -> parent: started and torch.distributed imported (and the answer to a
    :class:`Ping`). ``stack_file``: where the worker's stack goes on ``SIGUSR1``."""

    stack_file: str = ""


class Ping(NamedTuple):
    """Parent -> idle worker: are you alive? (answered with :class:`Ready`)."""


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


class Output(NamedTuple):
    """Worker -> parent: whole lines a rank printed, on ``stream`` ("stdout" or "stderr")."""

    stream: str
    text: str


class Result(NamedTuple):
    """Worker -> parent: ``fn`` returned; ``payload`` is its cloudpickled return value."""

    payload: bytes


class Failure(NamedTuple):
    """Worker -> parent: ``fn`` raised. ``peer_failed``: the error came from a message to or
    from a rank that had stopped (the worker's ``_caused_by_peer`` decides)."""

    exc_type: str
    traceback: str
    failed_at: float  # time.time() when it raised, to find which rank failed first
    peer_failed: bool
    summary: str  # "ExcType: first line of the message"
