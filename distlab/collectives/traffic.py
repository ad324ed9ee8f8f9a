"""Counting what this process sends through distlab's collectives (no torch needed).

Both engines call :func:`record_sent` for every message they post, and the agreement
check (:mod:`distlab.collectives.agree`) calls :func:`record_header` for each header
message it sends; :func:`count_traffic` opens a counter around any code (one collective,
a whole training step) and returns the bytes and messages this rank sent, by schedule,
and, apart, the header messages (what the check costs in messages; their bytes are not
in ``bytes_sent``, which counts the data the collectives move).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Traffic:
    """Bytes and messages this process sent inside :func:`count_traffic`; the agreement
    headers sent apart (``header_messages``)."""

    bytes_sent: int = 0
    messages: int = 0
    by_schedule: dict[str, int] = field(default_factory=dict)
    header_messages: int = 0

    def add(self, other: Traffic) -> None:
        """Add ``other``'s counts to these."""
        self.bytes_sent += other.bytes_sent
        self.messages += other.messages
        self.header_messages += other.header_messages
        for key, n in other.by_schedule.items():
            self.by_schedule[key] = self.by_schedule.get(key, 0) + n


_traffic: contextvars.ContextVar[Traffic | None] = contextvars.ContextVar("traffic", default=None)


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the bytes this rank sends through distlab's collectives.

    >>> with count_traffic() as t:            # doctest: +SKIP
    ...     ring_all_reduce(x)
    >>> t.bytes_sent                           # doctest: +SKIP

    Counters nest: what an inner ``count_traffic`` counts is also added to
    the one around it when the inner one closes (a per-call trace inside a
    whole-step count, as :func:`distlab.parallel.comm.trace.trace_comm` does).
    """
    outer = _traffic.get()
    traffic = Traffic()
    token = _traffic.set(traffic)
    try:
        yield traffic
    finally:
        _traffic.reset(token)
        if outer is not None:
            outer.add(traffic)


def record_sent(schedule, nbytes: int) -> None:
    """Add one message of ``nbytes`` sent by ``schedule`` to the open counters (if any)."""
    traffic = _traffic.get()
    if traffic is not None and nbytes:
        traffic.bytes_sent += nbytes
        traffic.messages += 1
        key = f"{schedule.algorithm}_{schedule.collective}"
        traffic.by_schedule[key] = traffic.by_schedule.get(key, 0) + nbytes


def record_header() -> None:
    """Add one agreement header message this rank sent to the open counters (if any)."""
    traffic = _traffic.get()
    if traffic is not None:
        traffic.header_messages += 1
