"""How a failed job is reported: what each rank did, and the two errors ``run`` raises.

:class:`RankError` when a rank raised or its process died (``outcomes`` says what every
rank did, one :class:`RankOutcome` each); :class:`LaunchTimeoutError` when the job ran past
its timeout (``stuck`` says where each unfinished rank was).
"""

from __future__ import annotations

from typing import NamedTuple

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
    ``stacks`` to its whole Python stack, as ``faulthandler`` printed it, and
    ``collectives`` to the collective it was in (``"distlab's ring_all_reduce"``,
    ``"torch.distributed.all_reduce"``, the end-of-job barrier, or "" for none).
    """

    def __init__(
        self,
        message: str,
        stuck: dict | None = None,
        stacks: dict | None = None,
        collectives: dict | None = None,
    ):
        super().__init__(message)
        self.stuck = dict(stuck or {})
        self.stacks = dict(stacks or {})
        self.collectives = dict(collectives or {})
