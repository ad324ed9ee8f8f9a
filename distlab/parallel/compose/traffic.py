"""A traced step's communication, per group and collective, against the calculator's prediction.

:func:`trace_table` sums every rank's :class:`~distlab.parallel.comm.trace.CommCall`
per (group, collective) and puts the prediction beside it
(:func:`distlab.calc.three_d.job_comm_totals`, summed over the same ranks).
Summing over ranks makes distlab's ring exact for any element count: a ring
all-reduce of n elements over K ranks sends each of its K chunks K - 1 times
in the reduce-scatter and K - 1 times in the all-gather, 2 (K-1) n elements in
all, which is K times the per-rank 2 (K-1)/K n of
:class:`distlab.calc.volume.CommPart` (one rank alone sends 2n minus the two
chunks it never sends, equal to the formula only when K divides n).
A row the calculator does not model shows ``-`` and ``not modelled``.

:func:`trace_three_d` runs one :func:`~distlab.parallel.compose.three_d.train_3d`
step on ``tp * pp * dp`` gloo processes inside :func:`trace_comm` and returns the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from distlab.calc.three_d import (
    Totals,
    gpt_layer_buffers,
    gpt_spec,
    job_comm_totals,
    rank_volumes,
)
from distlab.core.layout import Layout
from distlab.core.units import format_bytes
from distlab.launch import run
from distlab.models import gpt_batch
from distlab.parallel.comm.trace import CommCall, trace_comm

from .three_d import train_3d


@dataclass(frozen=True)
class TraceRow:
    """One (group, collective): measured totals over the job's ranks, and the prediction."""

    group: str
    collective: str
    calls: int
    elements: int
    payload_bytes: int
    wire_bytes: int
    predicted: Totals | None  # None: not modelled

    @property
    def match(self) -> bool | None:
        """Calls, payload and wire bytes all equal the prediction (None if not modelled)."""
        if self.predicted is None:
            return None
        p = self.predicted
        return (self.calls, self.payload_bytes, self.wire_bytes) == (
            p.calls, p.payload_bytes, p.wire_bytes,
        )  # fmt: skip


def measured_totals(calls: Iterable[CommCall]) -> dict[tuple[str, str], list[int]]:
    """``{(group, collective): [calls, elements, payload bytes, wire bytes]}`` over all calls."""
    totals: dict[tuple[str, str], list[int]] = {}
    for c in calls:
        t = totals.setdefault((c.group, c.collective), [0, 0, 0, 0])
        for i, n in enumerate((1, c.elements, c.payload_bytes, c.wire_bytes)):
            t[i] += n
    return totals


def trace_table(
    calls: Iterable[CommCall], predicted: dict[tuple[str, str], Totals]
) -> list[TraceRow]:
    """Rows for every (group, collective) measured or predicted, sorted by group."""
    measured = measured_totals(calls)
    keys = sorted(set(measured) | set(predicted))
    return [TraceRow(*key, *measured.get(key, [0, 0, 0, 0]), predicted.get(key)) for key in keys]


def format_trace_table(rows: list[TraceRow]) -> str:
    """Plain-text table: measured (and predicted) calls, payload and wire bytes; bytes in KiB."""

    def kib(x: float) -> str:
        return format_bytes(x, "KiB", 2).removesuffix(" KiB")

    def both(measured: float, predicted: float | None, fmt) -> str:
        return f"{fmt(measured)} / {'-' if predicted is None else fmt(predicted)}"

    header = (
        f"{'group':<10} {'collective':<12} {'calls meas/pred':>16} {'elements':>9} "
        f"{'payload KiB meas/pred':>22} {'wire KiB meas/pred':>22}  match"
    )
    lines = [header]
    for r in rows:
        p = r.predicted
        calls = both(r.calls, None if p is None else p.calls, lambda x: f"{x:g}")
        payload = both(r.payload_bytes, None if p is None else p.payload_bytes, kib)
        wire = both(r.wire_bytes, None if p is None else p.wire_bytes, kib)
        match = {None: "not modelled", True: "yes", False: "NO"}[r.match]
        lines.append(
            f"{r.group:<10} {r.collective:<12} {calls:>16} {r.elements:>9} {payload:>22} "
            f"{wire:>22}  {match}"
        )
    return "\n".join(lines)


def predicted_three_d(
    config, *, tp: int, pp: int, dp: int, batch: int, micro_batches: int, zero_stage: int = 0,
    chunks: int = 1,
):  # fmt: skip
    """:func:`~distlab.calc.three_d.job_comm_totals` of ``train_3d`` on a
    :class:`~distlab.models.GPTConfig` with ``batch`` sequences, fp32: the layout
    ``train_3d`` builds from these arguments (``chunks`` is ``virtual_stages``), with
    ``batch / (dp * micro_batches)`` sequences per micro-batch."""
    spec = gpt_spec(vocab=config.vocab, seq_len=config.seq_len, hidden=config.hidden,
                    heads=config.heads, layers=config.layers,
                    tie_embeddings=config.tie_embeddings)  # fmt: skip
    layout = Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, virtual_stages=chunks,
                    micro_batches=micro_batches, micro_batch=batch // (dp * micro_batches))  # fmt: skip
    volumes = rank_volumes(spec, layout, bytes_per_element=4,
                           layer_buffers=gpt_layer_buffers(spec))  # fmt: skip
    return job_comm_totals(volumes)


def trace_three_d(
    config, *, tp: int, pp: int, dp: int, batch: int, micro_batches: int, zero_stage: int = 0,
    schedule: str = "1f1b", chunks: int = 1, timeout: float = 300,
) -> list[TraceRow]:  # fmt: skip
    """Trace one ``train_3d`` step on ``tp * pp * dp`` gloo processes; the table's rows.
    ``zero_stage``, ``schedule`` and ``chunks`` are passed to ``train_3d``."""
    options = {"zero_stage": zero_stage, "schedule": schedule, "chunks": chunks}
    calls = run(
        _traced_step, tp * pp * dp, args=(config, tp, pp, dp, batch, micro_batches, options),
        timeout=timeout,
    )  # fmt: skip
    predicted = predicted_three_d(config, tp=tp, pp=pp, dp=dp, batch=batch,
                                  micro_batches=micro_batches, zero_stage=zero_stage,
                                  chunks=chunks)  # fmt: skip
    return trace_table([c for rank_calls in calls for c in rank_calls], predicted)


def _traced_step(
    rank, world_size, config, tp, pp, dp, batch, micro_batches, options=None
) -> list[CommCall]:
    """One ``train_3d`` step (SGD, ``options`` such as ``zero_stage``) inside ``trace_comm``."""
    torch.set_num_threads(1)
    tokens, targets = gpt_batch(batch, config, seed=1)
    with trace_comm() as trace:
        train_3d(config, tokens, targets, tp=tp, pp=pp, dp=dp, micro_batches=micro_batches,
                 steps=1, lr=0.1, **(options or {}))  # fmt: skip
    return trace.calls
