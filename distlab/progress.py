"""The one progress bar distlab shows: rich, on stderr, and only on a terminal.

    with progress_bar("distlab bench", total=len(plan)) as bar:
        for item in plan:
            bar.step(f"{item}")        # say what runs now
            ...
            bar.advance()              # one done

Off when stderr is not a terminal (CI logs, pipes, tests) or when ``enabled=False``, so
printed tables and ``--json`` output stay clean; the bar disappears once the loop ends,
and lines printed meanwhile go above it. Used by ``distlab bench``, ``distlab grade`` and
the scripts in ``benchmarks/``.
"""

from __future__ import annotations

from typing import Self


class ProgressBar:
    """One task on a rich :class:`~rich.progress.Progress`; every method is a no-op when off."""

    def __init__(self, description: str, total: int, enabled: bool = True):
        # rich is imported when a bar is made, not when distlab.progress is: the `distlab`
        # command imports this module through bench and grading on every start
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        console = Console(stderr=True)
        self.shown = enabled and console.is_terminal
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not self.shown,
        )
        self._task = self._progress.add_task(description, total=total)

    def step(self, description: str) -> None:
        """Show what is running now."""
        self._progress.update(self._task, description=description)

    def advance(self, steps: int = 1) -> None:
        self._progress.advance(self._task, steps)

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()


def progress_bar(description: str, total: int, enabled: bool = True) -> ProgressBar:
    """A :class:`ProgressBar` of ``total`` steps, shown only on a terminal."""
    return ProgressBar(description, total, enabled)
