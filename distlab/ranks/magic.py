"""The IPython magic: ``%ranks`` (start, stop, gather, push) and ``%%ranks`` (run a cell).

This module only reads what the learner typed, turns a mistake in it into a short
``UsageError`` that names what is wrong, and calls :class:`distlab.ranks.session.Ranks`.
The magic keeps the one running group; loading the extension also registers its stop at
the kernel's exit (the launcher's own clean-up covers a kernel that is killed).
"""

from __future__ import annotations

import atexit
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from distlab.launch import DEFAULT_TIMEOUT

from .session import Ranks

USAGE = """\
%ranks start N [--timeout SECONDS] [--backend gloo|nccl]   start N ranks (stops running ones)
%ranks stop                                                stop every rank
%ranks gather NAME [NAME ...]    each rank's NAME, as a list in rank order, into the notebook
%ranks push NAME [NAME ...]      the notebook's NAME, sent to every rank
%%ranks [RANKS]                  run the cell on every rank, or only on RANKS (0,2 or 1-3)"""


@magics_class
class RanksMagics(Magics):
    """``%ranks`` and ``%%ranks``; ``self.group`` is the running :class:`Ranks` (or None)."""

    def __init__(self, shell):
        super().__init__(shell)
        self.group: Ranks | None = None

    @line_cell_magic
    def ranks(self, line: str, cell: str | None = None) -> None:
        """Explore on N ranks cell by cell. Usage:

        %ranks start N [--timeout SECONDS] [--backend gloo|nccl]
        %ranks stop | gather NAME ... | push NAME ...
        %%ranks [RANKS]
        """
        if cell is not None:
            self._running("%%ranks").run_cell(cell, self._ranks(line))
            return
        command, *words = line.split(maxsplit=1) or [""]
        words = _checked(shlex.split, words[0]) if words else []
        if command == "start":
            self._start(words)
        elif command == "stop":
            stopped = self.group is not None and self.group.running
            self.stop()
            print(f"stopped {self.group.world_size} ranks" if stopped else "no ranks were running")
        elif command in ("gather", "push") and words:
            group = self._running(f"%ranks {command}")
            for name in words:
                if command == "gather":
                    self.shell.user_ns[name] = _checked(group.gather, name)
                elif name not in self.shell.user_ns:
                    raise UsageError(f"%ranks push {name}: {name} is not defined in the notebook")
                else:
                    _checked(group.push, name, self.shell.user_ns[name])
        else:
            raise UsageError(f"%ranks {line.strip()!r}: not a command. Usage:\n{USAGE}")

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()

    def _start(self, words: list[str]) -> None:
        number = words[0] if words else ""
        options = {"timeout": DEFAULT_TIMEOUT, "backend": "gloo"}
        flags = iter(words[1:])
        for flag in flags:
            value = next(flags, None)
            if flag not in ("--timeout", "--backend") or value is None:
                raise UsageError(
                    f"%ranks start: {flag!r} needs a value, or is not an option\n{USAGE}"
                )
            options[flag[2:]] = value
        try:
            world_size, timeout = int(number), float(options["timeout"])
        except ValueError:
            raise UsageError(
                f"%ranks start takes a number of ranks and a timeout in seconds, "
                f"like %ranks start 4 --timeout 30; got {' '.join(words)!r}"
            ) from None
        if self.group is not None and self.group.running:
            self.group.stop()
            print(f"stopped the {self.group.world_size} running ranks (their namespaces are gone)")
        self.group = _checked(Ranks, world_size, backend=options["backend"], timeout=timeout)
        print(
            f"{world_size} ranks ready ({options['backend']}, a cell may take "
            f"{self.group.timeout:g} s): rank, world_size, torch, dist and device are defined"
        )

    def _running(self, what: str) -> Ranks:
        if self.group is None:
            raise UsageError(f"{what}: no ranks are running; start them with %ranks start 4")
        if not self.group.running:
            raise UsageError(f"{what}: no ranks are running: {self.group.why_stopped}")
        return self.group

    def _ranks(self, line: str) -> list[int] | None:
        """``"0,2"`` / ``"0 2"`` / ``"1-3"`` as rank numbers, checked; ``""`` is every rank."""
        text = line.replace(",", " ").split()
        if not text:
            return None
        ranks = []
        try:
            for part in text:
                low, _, high = part.partition("-")
                ranks += range(int(low), int(high or low) + 1)
        except ValueError:
            raise UsageError(
                f"%%ranks {line.strip()}: name ranks by number, like %%ranks 0,2 or "
                "%%ranks 1-3 (nothing after %%ranks: every rank)"
            ) from None
        return _checked(self.group.check_ranks, ranks)


def _checked(call, *args, **kwargs):
    """``call(...)``; a ValueError, TypeError or NameError it raises about the learner's
    input becomes a UsageError, which IPython shows as one line."""
    try:
        return call(*args, **kwargs)
    except (ValueError, TypeError, NameError) as error:
        raise UsageError(str(error)) from None


def load_ipython_extension(shell) -> None:
    """``%load_ext distlab`` (or ``distlab.ranks``): register the magics, and stop the ranks
    when the kernel exits (a kernel that is killed: the launcher's workers watch it)."""
    magics = RanksMagics(shell)
    shell.register_magics(magics)
    atexit.register(magics.stop)


def unload_ipython_extension(shell) -> None:
    """``%unload_ext distlab``: stop the ranks (the magics stay registered, as IPython does)."""
    magics = shell.magics_manager.registry.get(RanksMagics.__name__)
    if magics is not None:
        magics.stop()
