"""How the ranks' output appears in the notebook: tagged with the ranks that gave it, and
what several ranks gave alike shown once.

Printed lines are shown as they arrive, each tagged ``[rank r]`` (the launcher's
:func:`~distlab.launch.parent.print_rank_output`, as for ``distlab.run``); the lines of
different ranks may interleave in any order. A cell's values come once every rank has
answered, and are grouped: ranks whose values look the same (the same display data) share
one output, ``[ranks 0-3] tensor([6., 6., 6., 6.])``, in the order of their first rank.
Outside a notebook, ``IPython.display.display`` prints the text form.
"""

from __future__ import annotations

from collections.abc import Iterable

from IPython.display import display

from distlab.launch.parent import print_rank_output


def rank_label(ranks: Iterable[int]) -> str:
    """``"rank 2"``, ``"ranks 0-3"``, ``"ranks 0, 2"``, ``"ranks 0-2, 5"``."""
    ranks = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(parts)}"


def grouped(by_rank: dict) -> list[tuple[list[int], object]]:
    """``{rank: value}`` as ``[(ranks, value)]``: equal values together, ordered by their
    first rank."""
    groups: list[tuple[list[int], object]] = []
    for rank in sorted(by_rank):
        for ranks, value in groups:
            if value == by_rank[rank]:
                ranks.append(rank)
                break
        else:
            groups.append(([rank], by_rank[rank]))
    return groups


def show_output(rank: int, stream: str, text: str) -> None:
    """Lines a rank printed, each tagged with its rank, on the notebook's stdout or stderr."""
    print_rank_output(rank, stream, text)


def show_data(ranks: Iterable[int], data: dict) -> None:
    """Display data tagged with the ranks it came from: text on the tag's line (below it if
    it has several lines); a rich form (a figure, HTML) below a tag of its own."""
    label = f"[{rank_label(ranks)}]"
    text = data.get("text/plain", "")
    if set(data) == {"text/plain"}:
        display({"text/plain": f"{label}{chr(10) if chr(10) in text else ' '}{text}"}, raw=True)
    else:
        print(label, flush=True)
        display(data, raw=True)


def show_values(values: dict[int, dict | None]) -> None:
    """The cell's value on each rank (None: it had none), grouped."""
    for ranks, data in grouped({r: v for r, v in values.items() if v is not None}):
        show_data(ranks, data)
