"""The progress bar the benchmark scripts share: rich, on stderr, only on a terminal.

    with progress_bar() as bar:
        task = bar.add_task("notebooks", total=len(names))
        for name in names:
            bar.update(task, description=name)
            ...
            bar.advance(task)

Off when stderr is not a terminal (CI logs, pipes), so the printed tables stay clean;
``transient=True`` removes the bar once the loop ends. Lines printed meanwhile go above it.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


def progress_bar() -> Progress:
    console = Console(stderr=True)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
