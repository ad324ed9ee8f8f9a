"""Ranks that must agree: one exchange, and the same ``ValueError`` on every rank.

Every rank of a parallel job runs the same code on what should be the same arguments:
the layout, the step count, the learning rate, the batch, the model. A rank with another
value either hangs (it builds other process groups, or runs more steps than the others)
or trains silently wrong (another batch, another learning rate). A collective cannot
notice: it only sees the tensors it moves.

:func:`check_same_across_ranks` compares named values before any of that. Each value
becomes exact text (:func:`describe`): an int, a string or ``None`` by ``repr``, a float
by ``repr`` too (Python's ``repr`` of a float round-trips: equal text, equal float), a
tensor by dtype, shape and the SHA-256 of its bytes (one changed token changes it), a
dataclass field by field. The ranks all-gather the text (the lengths first, then the
bytes padded to the longest, so texts of different lengths cannot hang the exchange),
and every rank compares every rank's text with rank 0's and raises the same
``ValueError`` naming the first value that differs and what the ranks had::

    lr differs across ranks: rank 0: 0.1, rank 3: 0.2
    the batch (tokens) differs across ranks: rank 2's differs from rank 0's (int64 (8, 8))

Cost: two small built-in all-gathers per call, the tensors hashed once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import torch
import torch.distributed as dist

from distlab.collectives.builtin import all_gather_single

#: the longest value shown in an error (the comparison always uses the whole text)
SHOWN_CHARACTERS = 120
#: the most disagreeing ranks one error lists by value
LISTED_RANKS = 4


def describe(name: str, value: object) -> list[tuple[str, str, str]]:
    """``[(name, shown, exact)]`` for ``value``: ``exact`` is compared across ranks and
    ``shown`` goes into the error. A dataclass gives one row per field (``layout.dp``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            row
            for f in dataclasses.fields(value)
            for row in describe(f"{name}.{f.name}", getattr(value, f.name))
        ]
    if isinstance(value, torch.Tensor):
        data = value.detach().reshape(-1).contiguous().cpu().view(torch.uint8)
        shown = f"{str(value.dtype).removeprefix('torch.')} {tuple(value.shape)}"
        return [(name, shown, f"{shown} sha256:{hashlib.sha256(data.numpy()).hexdigest()}")]
    if isinstance(value, float):  # numpy's float64 too
        exact = repr(float(value))
    elif isinstance(value, os.PathLike):
        exact = repr(os.fspath(value))
    else:
        exact = repr(value)
    shown = exact if len(exact) <= SHOWN_CHARACTERS else exact[: SHOWN_CHARACTERS - 3] + "..."
    return [(name, shown, exact)]


def parameters(name: str, module: torch.nn.Module) -> dict[str, object]:
    """``module``'s class and each parameter, named for :func:`check_same_across_ranks`
    (``"the model"``, ``"the model's blocks.0.fc1.weight"``, ...)."""
    named = {f"{name}'s {n}": p for n, p in module.named_parameters()}
    return {name: type(module).__name__, **named}


def check_same_across_ranks(
    values: dict[str, object],
    *,
    group: dist.ProcessGroup | None = None,
    among: str = "ranks",
    hint: str = "",
) -> None:
    """Raise the same ``ValueError`` on every rank of ``group`` (None: the world) unless
    every rank passed equal ``values`` (compared as :func:`describe` writes them). The
    error names the first value that differs, across ``among``, then ``hint``."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    rows = [row for name, value in values.items() for row in describe(name, value)]
    every = [json.loads(text) for text in _all_gather_text(json.dumps(rows), group)]
    message = first_difference(every, among)
    if message is not None:
        raise ValueError(f"{message}; {hint}" if hint else message)


def first_difference(tables: list[list], among: str = "ranks") -> str | None:
    """What differs first between the ranks' tables (one per rank, rows ``[name, shown,
    exact]`` as :func:`describe` makes them), or None when every table equals rank 0's."""
    for position in range(max(map(len, tables))):
        at = [table[position] if position < len(table) else None for table in tables]
        differing = [r for r, row in enumerate(at) if row != at[0]]
        if differing:
            return _explain(at, differing, among)
    return None


def _all_gather_text(text: str, group: dist.ProcessGroup | None) -> list[str]:
    """Every rank's ``text``, in group rank order (two built-in all-gathers)."""
    n = dist.get_world_size(group)
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    data = text.encode()
    lengths = torch.empty(n, dtype=torch.int64, device=device)
    mine = torch.tensor([len(data)], dtype=torch.int64, device=device)
    all_gather_single()(lengths, mine, group=group)
    lengths = lengths.cpu().tolist()
    width = max(lengths)
    padded = torch.zeros(width, dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = torch.empty(n * width, dtype=torch.uint8, device=device)
    all_gather_single()(gathered, padded.to(device), group=group)
    rows = gathered.view(n, width).cpu().numpy()
    return [rows[r, : lengths[r]].tobytes().decode() for r in range(n)]


def _explain(at: list, differing: list[int], among: str) -> str:
    """What differs at one position of the ranks' tables: each row ``[name, shown, exact]``,
    or None where a rank's table ended."""
    names = [row[0] if row else None for row in at]
    if any(names[r] != names[0] for r in differing):  # the ranks checked different things
        listing = ", ".join(f"rank {r}: {names[r] or 'nothing more'}" for r in [0, *differing])
        return (
            f"the ranks compared different lists of values ({listing}): do they run the same code?"
        )
    shown = [row[1] for row in at]
    listed = [r for r in differing if shown[r] != shown[0]]
    alike = [r for r in differing if shown[r] == shown[0]]  # a tensor's values, a long text
    parts = []
    if listed:
        more = len(listed) - LISTED_RANKS
        parts.append(
            ", ".join(f"rank {r}: {shown[r]}" for r in [0, *listed[:LISTED_RANKS]])
            + (f" and {more} more rank{'s' * (more > 1)}" if more > 0 else "")
        )
    if alike:
        ranks = ", ".join(map(str, alike))
        whose = f"rank {ranks}'s differs" if len(alike) == 1 else f"those of ranks {ranks} differ"
        parts.append(f"{whose} from rank 0's ({shown[0]})")
    return f"{names[0]} differs across {among}: " + "; ".join(parts)
