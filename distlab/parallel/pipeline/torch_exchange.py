"""Pipeline schedules to and from ``torch.distributed.pipelining``.

torch writes a schedule as ``pipeline_order``: for each rank a list of
``_Action(stage_index, computation_type, microbatch_index)``, with ``None``
for a step the rank sits idle in torch's drawing. distlab writes it as a
:class:`~distlab.core.pipeline_schedule.PipelineSchedule`: for each rank a list of
``Action(chunk, kind, micro_batch)``. The two say the same thing:

* torch's ``stage_index`` is distlab's virtual stage j; the chunk is j's
  place among the stages its rank holds (:meth:`PipelineSchedule.chunk_of`), and
  which rank holds which stage is the schedule's ``stage_to_rank``, torch's
  ``stage_index_to_group_rank`` (loop-around, or V-shaped for ZB-V);
* the kinds map one to one, below; an ``OVERLAP_F_B`` becomes its
  sub-actions in order, and ``None``, ``UNSHARD``, ``RESHARD`` and
  ``REDUCE_GRAD`` are dropped: idle steps and FSDP or data-parallel
  bookkeeping that no other stage waits for.

=============================  ========  =====================================
torch ``_ComputationType``     distlab   what runs
=============================  ========  =====================================
``F`` (``FORWARD``)            ``F``     forward
``B`` (``FULL_BACKWARD``)      ``B``     whole backward
``I`` (``BACKWARD_INPUT``)     ``I``     input gradient only (ZB's "B")
``W`` (``BACKWARD_WEIGHT``)    ``W``     weight gradients only
``SEND_F`` / ``RECV_F``        ``SF`` / ``RF``   activation message
``SEND_B`` / ``RECV_B``        ``SB`` / ``RB``   gradient message
=============================  ========  =====================================

torch's CSV form (``_dump_csv``/``_load_csv``) is one row per rank, one
cell per action written as ``str(_Action)`` (``"7F0"``, ``"3SEND_F1"``),
an empty cell for ``None``; :func:`write_csv` and :func:`read_csv` read
and write the same. torch is imported on first use, so importing this
module (and :mod:`distlab.parallel.pipeline`) stays cheap.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from distlab.core.pipeline_schedule import Action, PipelineSchedule

TORCH_KIND = {
    "F": "F",
    "B": "B",
    "I": "I",
    "W": "W",
    "SF": "SEND_F",
    "RF": "RECV_F",
    "SB": "SEND_B",
    "RB": "RECV_B",
}
"""distlab kind -> torch ``_ComputationType`` value."""
DISTLAB_KIND = {t: d for d, t in TORCH_KIND.items()}
DROPPED = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
"""torch kinds with no pipeline dependency: left out on import."""


def _schedules():
    from torch.distributed.pipelining import schedules

    return schedules


def to_torch(schedule: PipelineSchedule) -> dict[int, list]:
    """``{rank: [_Action, ...]}``, torch's ``pipeline_order`` for ``schedule``: each
    action's chunk becomes its virtual stage, its kind torch's (see the module
    table). A message between two stages on the same rank is left out, as
    torch's own lowering (``_add_send_recv``) leaves it out."""
    S = _schedules()
    order: dict[int, list] = {}
    for r, acts in enumerate(schedule.ranks):
        row = []
        for a in acts:
            j = schedule.virtual_stage(r, a.chunk)
            if a.kind in ("SF", "RB", "RF", "SB"):
                peer = j + 1 if a.kind in ("SF", "RB") else j - 1
                if schedule.rank_of(peer) == r:
                    continue
            kind = S._ComputationType(TORCH_KIND[a.kind])
            row.append(S._Action(j, kind, a.micro_batch))
        order[r] = row
    return order


def from_torch(
    source: Any,
    *,
    micro_batches: int | None = None,
    stage_to_rank: dict[int, int] | None = None,
    name: str | None = None,
) -> PipelineSchedule:
    """A distlab :class:`PipelineSchedule` from a torch schedule object or its
    ``pipeline_order`` dict (rank -> list of ``_Action`` or ``None``).

    From a schedule object ``micro_batches`` defaults to its
    ``_n_microbatches`` and ``stage_to_rank`` to its
    ``stage_index_to_group_rank``; from a bare dict they default to the
    largest micro-batch + 1 and to the rank that runs each stage. Giving m
    keeps an out-of-range action in the schedule for :func:`check` to name.
    """
    order = getattr(source, "pipeline_order", source)
    if micro_batches is None:
        micro_batches = getattr(source, "_n_microbatches", None)
    if stage_to_rank is None:
        stage_to_rank = getattr(source, "stage_index_to_group_rank", None)
    if name is None:
        name = type(source).__name__ if hasattr(source, "pipeline_order") else "torch"
    ranks = sorted(order)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"pipeline_order must have ranks 0..p-1, got {ranks}")
    rows = [list(_compute_and_messages(order[r])) for r in ranks]
    mapping = stage_to_rank if stage_to_rank is not None else _infer_mapping(rows)
    if sorted(mapping) != list(range(len(mapping))):
        raise ValueError(f"stage_to_rank must name stages 0..n-1, got {sorted(mapping)}")
    p, n = len(ranks), len(mapping)
    if n % p:
        raise ValueError(f"{n} stages cannot be shared evenly by {p} ranks: {mapping}")
    held = [sorted(j for j in mapping if mapping[j] == r) for r in range(p)]
    actions = []
    for r, row in enumerate(rows):
        mine = []
        for kind, j, i in row:
            if j not in held[r]:
                raise ValueError(
                    f"rank {r}: action {j}{TORCH_KIND[kind]}{i} runs stage {j}, "
                    f"which stage_to_rank gives to rank {mapping.get(j)}"
                )
            mine.append(Action(held[r].index(j), kind, i))  # chunk: j's place on rank r
        actions.append(tuple(mine))
    return PipelineSchedule(
        tuple(actions),
        n // p,
        name,
        micro_batches=micro_batches,
        stage_to_rank=tuple(mapping[j] for j in range(n)),
    )


def _compute_and_messages(row: list):
    """(distlab kind, stage, micro-batch) for each action torch's row runs, in order."""
    for action in row:
        if action is None:
            continue
        kind = action.computation_type.value
        if kind == "OVERLAP_F_B":
            yield from _compute_and_messages(list(action.sub_actions or ()))
        elif kind not in DROPPED:
            if kind not in DISTLAB_KIND or action.microbatch_index is None:
                raise ValueError(f"cannot read torch action {action!r} as a distlab action")
            yield DISTLAB_KIND[kind], action.stage_index, action.microbatch_index


def _infer_mapping(rows: list[list[tuple]]) -> dict[int, int]:
    """Each stage's rank: the rank whose compute actions run it (one rank per stage)."""
    mapping: dict[int, int] = {}
    for r, row in enumerate(rows):
        for kind, j, _ in row:
            if kind in ("F", "B", "I", "W") and mapping.setdefault(j, r) != r:
                raise ValueError(f"stage {j} is run by both rank {mapping[j]} and rank {r}")
    return mapping


def torch_schedule(schedule_class: type | str, stages: int, micro_batches: int, chunks: int = 1):
    """One of torch's schedules, built for p = ``stages`` ranks with v = ``chunks``
    stages each, with no process group: the stages are stand-ins that carry
    only what the constructor reads (``num_stages``, ``group_size``,
    ``group_rank``). Good for reading its ``pipeline_order``, not for ``step``."""
    S = _schedules()
    cls = getattr(S, schedule_class) if isinstance(schedule_class, str) else schedule_class
    stand_ins = [
        SimpleNamespace(
            num_stages=stages * chunks,
            group_size=stages,
            group_rank=0,
            stage_index=c * stages,
            submod=None,
            stage_index_to_group_rank=None,
        )
        for c in range(chunks)
    ]
    if issubclass(cls, S.PipelineScheduleSingle):
        if chunks != 1:
            raise ValueError(f"{cls.__name__} runs one stage per rank; got chunks={chunks}")
        return cls(stand_ins[0], micro_batches)
    return cls(stand_ins, micro_batches)


def write_csv(schedule: PipelineSchedule, path: str | Path) -> None:
    """Write ``schedule`` in torch's CSV form: one row per rank of ``str(_Action)``."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for _, row in sorted(to_torch(schedule).items()):
            writer.writerow(row)


def read_csv(path: str | Path, **kwargs: Any) -> PipelineSchedule:
    """Read torch's CSV form (as :func:`write_csv` or torch's ``_dump_csv`` write it);
    ``kwargs`` as for :func:`from_torch`."""
    S = _schedules()
    with open(path, newline="") as f:
        order = {
            r: [S._Action.from_str(cell) for cell in row] for r, row in enumerate(csv.reader(f))
        }
    kwargs.setdefault("name", "csv")
    return from_torch(order, **kwargs)
