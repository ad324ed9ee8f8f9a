"""What a ``%%ranks`` cell raises when it does not end well: the launcher's errors, with the
interactive group's story.

* :class:`CellError` (a :class:`~distlab.launch.RankError`): ranks raised in the cell;
  nothing was stopped, every rank keeps its namespace;
* :class:`CellTimeoutError` (a :class:`~distlab.launch.LaunchTimeoutError`): the cell ran
  past its timeout, or did not stop when interrupted; ``stuck`` and ``stacks`` say where
  each unfinished rank was, ``lost`` what the restart lost;
* :class:`RankDiedError` (a :class:`~distlab.launch.RankError`): a rank's process ended;
  the other ranks were stopped with it;
* :class:`CellInterrupted` (a ``KeyboardInterrupt``): Ctrl+C stopped the cell on every
  rank still running it, and every rank keeps its namespace;
* :class:`NotRunningError`: there are no ranks to run a cell on.

Each shows in a notebook as its message alone (``_render_traceback_``, which IPython
calls): the ranks' tracebacks are what matters, not the magic's frames that raised it.
"""

from __future__ import annotations

from distlab.launch import RAISED, LaunchTimeoutError, RankError, RankOutcome
from distlab.launch.errors import FINISHED, PEER_FAILED
from distlab.launch.messages import Failure

from .show import grouped, rank_label


class _ShownAsMessage:
    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class CellError(_ShownAsMessage, RankError):
    """Ranks raised in a cell (``failures``: each one's :class:`Failure`, its traceback from
    the cell down). ``rank`` is the first that raised on its own (not because a peer it
    was talking to had stopped)."""

    def __init__(self, failures: dict[int, Failure], finished: list[int]):
        own = {r: f for r, f in failures.items() if not f.peer_failed} or failures
        first = min(own, key=lambda r: own[r].failed_at)
        outcomes = [RankOutcome(r, PEER_FAILED if f.peer_failed else RAISED, f.summary)
                    for r, f in failures.items()] + [RankOutcome(r, FINISHED) for r in finished]  # fmt: skip
        super().__init__(
            first,
            failures[first].traceback,
            failures[first].exc_type,
            also_failed=sorted(set(failures) - {first}),
            outcomes=tuple(sorted(outcomes)),
        )
        self.failures = dict(failures)
        did = f"; {rank_label(finished)} finished it" if finished else ""
        lines = [f"{rank_label(failures)} raised in the cell{did}. Every rank keeps its namespace."]
        for ranks, text in grouped({r: f.traceback.rstrip() for r, f in failures.items()}):
            lines += [f"--- {rank_label(ranks)} ---", text]
        self.args = ("\n".join(lines),)  # the launcher's wording says every rank was stopped


class CellTimeoutError(_ShownAsMessage, LaunchTimeoutError):
    """A cell ran past its timeout (or ignored Ctrl+C). ``lost``: rank -> the names its
    namespace held, which the restart lost; ``restarted``: whether fresh ranks run now."""

    def __init__(self, message, stuck, stacks, collectives, lost: dict, restarted: bool):
        super().__init__(message, stuck, stacks, collectives)
        self.lost, self.restarted = dict(lost), restarted


class RankDiedError(_ShownAsMessage, RankError):
    """A rank's process ended (killed, ``os._exit``, a crash in native code); ``exit_codes``
    maps each rank that died to its exit code (negative: the signal that killed it)."""

    def __init__(self, message: str, exit_codes: dict[int, int | None], outcomes):
        first = min(exit_codes)
        super().__init__(first, message, "ProcessDied", sorted(exit_codes)[1:], outcomes)
        self.exit_codes = dict(exit_codes)
        self.args = (message,)


class CellInterrupted(_ShownAsMessage, KeyboardInterrupt):
    """Ctrl+C stopped the cell on the ranks still running it; every rank keeps its
    namespace."""


class NotRunningError(_ShownAsMessage, RuntimeError):
    """No ranks are running (never started, stopped, or stopped after a rank died)."""
