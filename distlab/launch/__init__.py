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
fresh processes and ``shutdown()`` stops the pool. On Linux a new worker is
forked from a *starter*, one process that imported torch once, so a job that
needs more workers than the pool holds, or follows a failed job, starts in
milliseconds too (``starter``); ``prestart()`` starts that process ahead of
the first run.

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

The modules, in reading order (each reads on its own):

``parent``    ``run`` itself and ``start_job`` (its first half), then the helpers they call
``messages``  what parent and worker send each other, and when
``worker``    the worker process: its loop, and running one job as one rank
``errors``    :class:`RankError`, :class:`LaunchTimeoutError`, what each rank did
``starter``   forking ready workers from one process that imported torch (Linux)
``template``  one process that imported torch, forking a starter for each kernel (and
              the grader's kernels themselves) where many kernels run
``kernel_child`` a fork of the template becoming a Jupyter kernel: checked, then set up
              as ``python -m ipykernel_launcher`` would be
``torchrun``  :func:`init`

``import distlab.launch`` does not import torch: ``run`` imports it when called, and a
worker imports it once, as it starts.
"""

from __future__ import annotations

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
from .parent import DEFAULT_TIMEOUT, prestart, run, shutdown, threads_per_rank, where_stuck
from .torchrun import init
from .worker import process_group_timeout

__all__ = [
    "DEFAULT_TIMEOUT",
    "DIED",
    "FINISHED",
    "PEER_FAILED",
    "RAISED",
    "STOPPED",
    "LaunchTimeoutError",
    "RankError",
    "RankOutcome",
    "init",
    "prestart",
    "process_group_timeout",
    "run",
    "shutdown",
    "threads_per_rank",
    "where_stuck",
]
