"""Explore on N ranks cell by cell: ranks that keep their namespaces between notebook cells.

``distlab.run(fn, world_size)`` ships a function and returns its results: right for
exercises and repeatable demos. To look at rank 2's buffer after step 1 of a ring, change
one line and look again, keep the ranks instead::

    %load_ext distlab
    %ranks start 4                  # 4 gloo processes, process group initialised

    %%ranks
    x = torch.full((4,), float(rank))
    dist.all_reduce(x)
    x                               # shown once per distinct value: [ranks 0-3] tensor(...)

    %%ranks 0,2                     # only these ranks; the others keep their state
    x[0] += 1

    %ranks gather x                 # the notebook's x: [x of rank 0, x of rank 1, ...]
    %ranks push lr                  # the notebook's lr, sent to every rank
    %ranks stop

Every rank starts with ``rank``, ``world_size``, ``torch``, ``dist``, ``device`` and
``display``. A rank that raises shows its traceback and keeps its namespace; a cell that
runs past its timeout (``%ranks start 4 --timeout 30``; a deadlock, usually) shows where
each rank was stuck and restarts the ranks; a rank that dies is reported with its exit
code; Ctrl+C interrupts every rank. Nothing outlives the kernel.

The modules, in reading order:

``messages``  what the notebook and a rank say to each other
``rank``      a rank: the launcher runs :func:`~distlab.ranks.rank.serve` on each worker
``session``   the notebook's side, :class:`~distlab.ranks.session.Ranks`: requests, and
              every way they can end
``show``      output tagged with the ranks that gave it; equal values shown once
``errors``    what a cell raises when it does not end well
``magic``     ``%ranks`` and ``%%ranks``

The ranks are one long job of :mod:`distlab.launch`: its workers, its process-group set-up,
its clean-up and its stack dumps.
"""

from __future__ import annotations

from .magic import load_ipython_extension, unload_ipython_extension
from .session import Ranks

__all__ = ["Ranks", "load_ipython_extension", "unload_ipython_extension"]
