"""The notebook's side of the interactive ranks: start N ranks, send them cells, and handle
every way a cell can end.

:class:`Ranks` starts the ranks as one long job of distlab's launcher
(:func:`~distlab.launch.parent.start_job`, with :func:`distlab.ranks.rank.serve` as the
function): the workers are the launcher's (forked from its starter, torch already
imported), and so are the process group set-up, the clean-up (a rank is killed with its
whole process group, and a rank whose parent dies exits), the stack dumps and the errors.

A request (a cell, a push, a gather) goes to the ranks it is for; while they work, their
printed lines are shown as they arrive, and every rank's socket is watched. It ends in one
of five ways:

* **every rank answers**: the values are shown, grouped (:mod:`distlab.ranks.show`); if
  some ranks raised, :class:`~distlab.ranks.errors.CellError` shows their tracebacks. Each
  rank keeps its namespace either way;
* **a rank dies** (its socket closes): the other ranks are killed too, for a process group
  cannot go on without one of its ranks, and :class:`~distlab.ranks.errors.RankDiedError`
  says which rank died with which exit code; ``%ranks start`` brings up a fresh group;
* **the timeout passes** (usually a deadlock: a collective that some ranks never call):
  each unfinished rank's Python stack is read (``faulthandler`` on ``SIGUSR1``, as for
  :class:`~distlab.launch.LaunchTimeoutError`), every rank is killed and fresh ranks are
  started, and :class:`~distlab.ranks.errors.CellTimeoutError` says where each rank was
  stuck and which names were lost. Why not keep them: a rank waiting in a collective is
  inside gloo's C++ code, where no Python signal handler runs; gloo cannot cancel a
  collective; and a new process group needs every rank, the stuck one included. So the
  only way out is new processes, and with them new namespaces;
* **Ctrl+C** (the notebook's interrupt): every rank still running gets ``SIGINT``, which
  raises ``KeyboardInterrupt`` in its cell; if they all stop within
  :data:`INTERRUPT_GRACE_S`, every namespace is kept (:class:`~.errors.CellInterrupted`),
  otherwise the ones that did not stop are stuck as above, and handled the same way;
* **a rank raises on its own while others still run**: a notice says so at once (the
  others may be waiting for it in a collective, until the timeout or Ctrl+C).
"""

from __future__ import annotations

import re
import signal
import sys
import time
from multiprocessing.connection import wait

import cloudpickle

from distlab.core.checks import int_in
from distlab.core.processes import signal_quietly
from distlab.launch import DEFAULT_TIMEOUT, DIED, STOPPED, RankOutcome
from distlab.launch.messages import Failure, Output, Result
from distlab.launch.parent import (
    MAX_LOCAL_RANKS,
    Died,
    collective_in,
    job_frames,
    receive,
    start_job,
)

from .errors import CellError, CellInterrupted, CellTimeoutError, NotRunningError, RankDiedError
from .messages import Cell, Display, Done, Gather, Push
from .rank import serve
from .show import grouped, rank_label, show_data, show_output, show_values

#: How long ranks have to stop after Ctrl+C before they count as stuck (a rank in Python
#: code stops at once; one waiting in gloo's C++ code never does).
INTERRUPT_GRACE_S = 3.0

#: When one rank raised and others still run this much later, a notice says so (they may
#: be waiting for it in a collective, and only the timeout or Ctrl+C will end the cell).
NOTE_AFTER_S = 2.0


class Ranks:
    """``world_size`` live ranks, each with its own namespace, running the cells sent to
    them (``backend``: "gloo" on CPU, "nccl" gives rank ``r`` GPU ``r``; ``timeout``: the
    most seconds one cell, push or gather may take)."""

    def __init__(self, world_size: int, *, backend: str = "gloo", timeout=DEFAULT_TIMEOUT):
        self.world_size, self.backend, self.timeout = world_size, backend, timeout
        self.cells = 0  # cells run so far: cell n's code is "<cell n>" in tracebacks
        self.names: dict[int, tuple[str, ...]] = {}  # rank -> the names its cells defined
        self.pids: list[int] = []
        self.why_stopped = ""
        self._job = None
        self._start()

    @property
    def running(self) -> bool:
        return self._job is not None

    # ---------------------------------------------------------------- requests ---
    def run_cell(self, code: str, ranks: list[int] | None = None) -> dict[int, dict | None]:
        """Run ``code`` on ``ranks`` (every rank if None), show what they print and their
        values, and return each rank's value as display data (None if it had none)."""
        targets = self.check_ranks(ranks)
        self.cells += 1
        replies = self._ask({r: Cell(self.cells, code) for r in targets}, code)
        values = {r: replies[r].value for r in targets}
        show_values(values)
        failures = {r: d.failure for r, d in replies.items() if d.failure}
        if failures:
            raise CellError(failures, sorted(set(targets) - set(failures)))
        return values

    def push(self, name: str, value) -> None:
        """Set ``name`` to ``value`` on every rank (sent by value, with cloudpickle)."""
        try:
            payload = cloudpickle.dumps(value)
        except Exception as exc:
            raise TypeError(f"{name} cannot be sent to the ranks: {exc}") from exc
        replies = self._ask({r: Push(name, payload) for r in range(self.world_size)})
        failures = {r: d.failure for r, d in replies.items() if d.failure}
        if failures:
            raise CellError(failures, sorted(set(replies) - set(failures)))

    def gather(self, name: str) -> list:
        """The value of ``name`` on every rank, in rank order."""
        replies = self._ask({r: Gather(name) for r in range(self.world_size)})
        problems = {r: g.problem for r, g in replies.items() if g.problem}
        if problems:
            said = "; ".join(f"on {rank_label(rs)}, {p}" for rs, p in grouped(problems))
            error = NameError if all("not defined" in p for p in problems.values()) else TypeError
            raise error(f"cannot gather {name}: {said}")
        return [cloudpickle.loads(replies[r].payload) for r in range(self.world_size)]

    def stop(self, why: str = "") -> None:
        """Kill every rank, with whatever it started (``why``: what a later cell is told)."""
        if self._job is not None:
            self._job.kill()
            self._job = None
        self.why_stopped = why or f"the {self.world_size} ranks were stopped (%ranks stop)"

    def check_ranks(self, ranks: list[int] | None) -> list[int]:
        """``ranks`` checked against this group (None: every rank), sorted."""
        if ranks is None:
            return list(range(self.world_size))
        last = self.world_size - 1
        for rank in ranks:
            if not isinstance(rank, int) or not 0 <= rank <= last:
                raise ValueError(
                    f"there is no rank {rank!r}: the {self.world_size} ranks are 0-{last}"
                )
        return sorted(set(ranks))

    # ----------------------------------------------------------- the machinery ---
    def _start(self) -> None:
        self.world_size = int_in("the number of ranks", self.world_size, 1, MAX_LOCAL_RANKS)
        job = start_job(serve, self.world_size, backend=self.backend, timeout=self.timeout)
        self._job, self.timeout = job, job.timeout
        pending, hellos = set(range(self.world_size)), {}
        try:
            self._collect(pending, job.deadline, hellos)
        except BaseException:
            self.stop("starting the ranks failed")
            raise
        if pending:
            self.stop("starting the ranks timed out")
            raise TimeoutError(f"ranks {sorted(pending)} did not start within {self.timeout:g} s")
        self.pids = [hellos[r].pid for r in range(self.world_size)]
        self.names = {r: () for r in range(self.world_size)}
        self.why_stopped = ""

    def _ask(self, requests: dict[int, object], code: str = "") -> dict:
        """Send each rank its request and wait for every answer (see the module's story)."""
        if self._job is None:
            raise NotRunningError(f"no ranks are running: {self.why_stopped}")
        self._drain()
        for rank, request in requests.items():
            try:
                self._job.workers[rank].conn.send(request)
            except OSError:  # it died since _drain looked
                raise self._died(rank, receive(self._job.workers[rank])) from None
        pending, replies = set(requests), {}
        try:
            self._collect(pending, time.monotonic() + self.timeout, replies)
        except KeyboardInterrupt:
            self._interrupt(pending, replies, code)
        if pending:
            raise self._stuck(pending, code, f"ran past its {self.timeout:g} s timeout")
        for rank, reply in replies.items():
            if isinstance(reply, Done):
                self.names[rank] = reply.names
        return replies

    def _collect(self, pending: set[int], deadline: float, replies: dict) -> None:
        """Receive until every rank in ``pending`` answered (removed from it, its reply in
        ``replies``) or ``deadline`` passed; show output as it comes; raise if a rank dies."""
        workers = self._job.workers
        rank_of = {w.conn: r for r, w in enumerate(workers)}
        failed, note_at = None, float("inf")  # the first rank that raised, when to say so
        while pending and (remaining := deadline - time.monotonic()) > 0:
            if time.monotonic() >= note_at:
                self._note_failure(*failed, pending)
                note_at = float("inf")
            for conn in wait(list(rank_of), timeout=min(remaining, note_at - time.monotonic())):
                rank = rank_of[conn]
                message = receive(workers[rank])
                if isinstance(message, Output):
                    show_output(rank, message.stream, message.text)
                elif isinstance(message, Display):
                    show_data([rank], message.data)
                elif isinstance(message, Died | Failure | Result):
                    raise self._died(rank, message)
                elif rank in pending:
                    replies[rank] = message
                    pending.discard(rank)
                    if isinstance(message, Done) and message.failure and failed is None:
                        failed, note_at = (rank, message.failure), time.monotonic() + NOTE_AFTER_S

    def _drain(self) -> None:
        """Show what idle ranks printed since the last request (a thread of theirs), and
        notice a rank that died while idle."""
        for rank, worker in enumerate(self._job.workers):
            while worker.conn.poll(0):
                message = receive(worker)
                if isinstance(message, Output):
                    show_output(rank, message.stream, message.text)
                elif isinstance(message, Died | Failure | Result):
                    raise self._died(rank, message)

    def _note_failure(self, rank: int, failure: Failure, pending: set[int]) -> None:
        print(
            f"[rank {rank}] raised {failure.summary}; {rank_label(pending)} still running "
            f"(if they wait for rank {rank} in a collective, interrupt the kernel, or wait "
            f"for the {self.timeout:g} s timeout)",
            file=sys.stderr,
            flush=True,
        )

    def _interrupt(self, pending: set[int], replies: dict, code: str) -> None:
        """Ctrl+C in the notebook: interrupt every rank still running, and wait a moment."""
        for rank in pending:
            signal_quietly(self.pids[rank], signal.SIGINT)
        try:
            self._collect(pending, time.monotonic() + INTERRUPT_GRACE_S, replies)
        except KeyboardInterrupt:
            pass  # Ctrl+C again: stop waiting
        if pending:
            raise self._stuck(pending, code, "did not stop when interrupted") from None
        done = {r: d for r, d in replies.items() if isinstance(d, Done)}
        for rank, reply in done.items():
            self.names[rank] = reply.names
        stopped = sorted(r for r, d in done.items() if d.failure)
        said = f"{rank_label(stopped)} stopped the cell" if stopped else "the ranks had finished"
        raise CellInterrupted(
            f"interrupted: {said}. Every rank keeps its namespace, with whatever the cell had "
            "done before it stopped."
        ) from None

    def _stuck(self, pending: set[int], code: str, what: str) -> CellTimeoutError:
        """Ranks that will not finish: read their stacks, restart every rank, say why."""
        stacks = {rank: self._job.workers[rank].stack() for rank in sorted(pending)}
        where = {rank: where_in_cell(stack, self.cells, code) for rank, stack in stacks.items()}
        collectives = {rank: collective_in(stack) for rank, stack in stacks.items()}
        lost = {r: names for r, names in self.names.items() if names}
        lines = [f"cell {self.cells} {what}: {rank_label(pending)} had not finished."]
        lines += [f"  rank {rank} was in {where[rank]}" for rank in sorted(pending)]
        lines.append(
            "A rank waiting in a collective is inside gloo's C++ code: no signal reaches "
            "Python there, gloo cannot cancel the collective, and a new process group needs "
            "every rank. So every rank was stopped"
        )
        self.stop("the ranks were stuck")
        try:
            self._start()
            lines[-1] += f", and {self.world_size} fresh ranks started."
        except Exception as exc:  # noqa: BLE001 - said in the message; %ranks start retries
            lines[-1] += f"; starting fresh ones failed too ({exc}): run %ranks start."
        lines.append(_lost_names(lost))
        return CellTimeoutError(
            "\n".join(lines), where, stacks, collectives, lost=lost, restarted=self.running
        )

    def _died(self, rank: int, message) -> RankDiedError:
        """A rank's process ended (or its server stopped): stop the others and say so."""
        ended = {rank: message}
        grace = time.monotonic() + 0.5  # a rank killed with others: report them all
        for other, worker in enumerate(self._job.workers):
            if other not in ended and worker.process.poll() is None:
                worker.conn.poll(max(grace - time.monotonic(), 0))
            if other not in ended and worker.process.poll() is not None:
                ended[other] = Died(worker.process.poll())
        lost = {r: names for r, names in self.names.items() if names}
        lines = [f"{rank_label([r])} {_how_it_ended(m)}" for r, m in sorted(ended.items())]
        others = sorted(set(range(self.world_size)) - set(ended))
        if others:
            lines.append(
                f"A process group cannot go on without one of its ranks: {rank_label(others)} "
                "were stopped too."
            )
        lines += [_lost_names(lost), f"%ranks start {self.world_size} brings up a fresh group."]
        outcomes = tuple(
            RankOutcome(r, DIED, _how_it_ended(ended[r])) if r in ended else RankOutcome(r, STOPPED)
            for r in range(self.world_size)
        )
        self.stop(f"{rank_label(sorted(ended))} died (%ranks start {self.world_size} again)")
        codes = {r: getattr(m, "exit_code", None) for r, m in ended.items()}
        return RankDiedError("\n".join(lines), codes, outcomes)


def _how_it_ended(message) -> str:
    if isinstance(message, Died):
        code = message.exit_code
        how = f"exited with code {code}"
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name} (exit code {code})"
        words = [line for line in message.last_words.strip().splitlines() if line.strip()][-5:]
        said = "; its last words on stderr:\n    " + "\n    ".join(words) if words else ""
        return f"died: its process {how}{said}"
    if isinstance(message, Failure):
        return f"stopped serving cells: {message.summary}"
    return "stopped serving cells"


def _lost_names(lost: dict[int, tuple[str, ...]]) -> str:
    if not lost:
        return "No names had been defined on the ranks, so nothing was lost."
    said = "; ".join(f"{', '.join(names)} on {rank_label(ranks)}" for ranks, names in grouped(lost))
    return f"Lost with the old ranks: {said}."


_FRAME = re.compile(r"<cell (\d+)>")


def where_in_cell(stack: str, cell: int, code: str) -> str:
    """Where a stuck rank was, from its stack dump: the collective it was in (if any) and
    the line of the cell that called it, ``"torch.distributed.all_reduce, at line 3 of the
    cell: dist.all_reduce(x)"``."""
    frames = job_frames(stack)
    if not frames:
        return "an unknown place (its stack could not be read)"
    in_cell = [(int(line), name) for path, line, name in frames if path == f"<cell {cell}>"]
    collective = collective_in(stack)
    what = collective or f"{frames[0][2]} ({frames[0][0].rsplit('/', 1)[-1]}:{frames[0][1]})"
    if not in_cell:
        return what
    line = in_cell[0][0]  # innermost: the line running when the stack was read
    lines = code.splitlines()
    source = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f"{what}, at line {line} of the cell: {source}"
