"""What the notebook and a rank say to each other while the ranks run cells.

The ranks are one long job of distlab's launcher (:func:`distlab.launch.parent.start_job`),
so they talk over the worker's socket (:class:`distlab.launch.worker.JobChannel`), beside
the launcher's own messages: a rank's printed lines still arrive as the launcher's
:class:`~distlab.launch.messages.Output`, and a rank whose process ends is noticed as the
launcher notices it (the socket closes).

The conversation, in order:

1. each rank joins the process group (the launcher does that before the job's function
   runs) and sends :class:`Hello`;
2. then it waits for a request, and answers each with one reply:

   - :class:`Cell` -> :class:`Done` (after any :class:`Display` the cell made);
   - :class:`Push` -> :class:`Done` (no value);
   - :class:`Gather` -> :class:`Gathered`;
   - ``None`` -> the rank's function returns, and the launcher ends the job as usual.
"""

from __future__ import annotations

from typing import NamedTuple

from distlab.launch.messages import Failure


class Hello(NamedTuple):
    """Rank -> notebook: the process group is up and the namespace is ready."""

    rank: int
    pid: int


class Cell(NamedTuple):
    """Notebook -> rank: run ``code`` (cell ``number``: it names the code in tracebacks)."""

    number: int
    code: str


class Push(NamedTuple):
    """Notebook -> rank: set ``name`` to the cloudpickled value ``payload``."""

    name: str
    payload: bytes


class Gather(NamedTuple):
    """Notebook -> rank: send back the value of ``name``."""

    name: str


class Display(NamedTuple):
    """Rank -> notebook: something to show now (``display(...)`` in a cell, or a figure the
    cell left open): ``data`` maps MIME types to what Jupyter shows (``text/plain``,
    ``image/png`` as base64 text, ...)."""

    data: dict


class Done(NamedTuple):
    """Rank -> notebook: the request is done. ``value``: the cell's last expression as
    ``Display`` data (None if there was none); ``failure``: what it raised (the launcher's
    :class:`~distlab.launch.messages.Failure`, its traceback starting at the cell), or None;
    ``names``: the names the cell's namespace defines now (what a restart would lose)."""

    value: dict | None
    failure: Failure | None
    names: tuple[str, ...]


class Gathered(NamedTuple):
    """Rank -> notebook: the cloudpickled value asked for, or ``problem`` saying why not."""

    payload: bytes = b""
    problem: str = ""
