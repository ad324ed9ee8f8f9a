"""Naive against bucketed DDP, timed side by side in one run.

Three ways to average the same gradients, on copies of the same model, each
doing the same steps:

==========================  ===================================================
``"naive"``                 :class:`~distlab.parallel.data.ddp.NaiveDDP`: after
                            backward, one all-reduce per parameter tensor
``"bucketed"``              :class:`~distlab.parallel.data.ddp.BucketedDDP` with
                            ``overlap=False``: one all-reduce per bucket, all
                            after backward (what fewer, larger messages buy)
``"bucketed_overlap"``      ``BucketedDDP`` as DDP runs it: each bucket's
                            all-reduce starts as soon as its gradients exist
                            (what overlap with backward buys on top)
==========================  ===================================================

Li et al. 2020 (VLDB, Section 5, Figures 8-9) measure both effects on GPUs.
To compare fairly on a busy laptop the variants take turns: every round runs
one step of each (in a rotating order), each step starting after a barrier,
so slow and fast moments of the machine fall on all of them alike. A step
ends when its slowest rank ends: :func:`summarise` takes, per step, the
maximum over ranks, then the median over steps.

:func:`time_ddp_variants` runs on every rank inside ``distlab.run``;
``benchmarks/ddp_overlap.py`` prints the table.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.models import MLP
from distlab.parallel.comm.buckets import DEFAULT_BUCKET_CAP_MB
from distlab.parallel.data.ddp import BucketedDDP, NaiveDDP
from distlab.parallel.data.step_trace import StepTrace

VARIANTS = ("naive", "bucketed", "bucketed_overlap")


@dataclass
class VariantTiming:
    """One variant's steps on one rank."""

    variant: str
    step_seconds: list[float]
    collectives_per_step: int
    n_tensors: int
    n_buckets: int
    traces: list[StepTrace] = field(default_factory=list)  # bucketed variants only


@dataclass(frozen=True)
class TimingRow:
    """One line of the comparison: step time of the slowest rank, median over steps."""

    variant: str
    median_seconds: float
    collectives_per_step: int
    speedup_over_naive: float  # naive's median / this median
    exposed_comm_seconds: float  # median time from end of backward to last all-reduce end


def _wrap(variant: str, model: torch.nn.Module, algorithm: str, bucket_cap_mb: float):
    if variant == "naive":
        return NaiveDDP(model, algorithm=algorithm)
    overlap = variant == "bucketed_overlap"
    return BucketedDDP(model, algorithm=algorithm, bucket_cap_mb=bucket_cap_mb, overlap=overlap)


def time_ddp_variants(
    rank: int,
    world_size: int,
    *,
    sizes: Sequence[int] = (512, 1024, 1024, 1024, 1024, 512),
    batch: int = 128,
    steps: int = 10,
    warmup: int = 2,
    algorithm: str = "ring",
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    variants: Sequence[str] = VARIANTS,
) -> dict[str, VariantTiming]:
    """Time ``steps`` SGD steps of each variant on an MLP of ``sizes`` (after ``warmup``).

    Call on every rank (``distlab.run(time_ddp_variants, 2, ...)``). Each
    rank's batch has ``batch`` samples; the model is
    ``distlab.models.MLP(sizes)``.
    """
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"variants must be a non-empty subset of {VARIANTS}, got {variants!r}")
    if not isinstance(steps, int) or steps < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got {steps!r} and {warmup!r}")
    wrapped = {v: _wrap(v, MLP(tuple(sizes), seed=0), algorithm, bucket_cap_mb) for v in variants}
    optimizers = {v: torch.optim.SGD(m.parameters(), lr=1e-3) for v, m in wrapped.items()}
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, sizes[0], generator=gen)
    y = torch.randn(batch, sizes[-1], generator=gen)
    out = {}
    for v, ddp in wrapped.items():
        n_tensors = len(ddp.params) if v == "naive" else sum(len(b.params) for b in ddp.buckets)
        n_buckets = 0 if v == "naive" else len(ddp.buckets)
        out[v] = VariantTiming(v, [], n_buckets or n_tensors, n_tensors, n_buckets)
    order = list(variants)
    for step in range(warmup + steps):
        for v in order[step % len(order) :] + order[: step % len(order)]:
            ddp, opt = wrapped[v], optimizers[v]
            if world_size > 1:
                dist.barrier()
            start = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            if step >= warmup:
                out[v].step_seconds.append(time.perf_counter() - start)
    for v, ddp in wrapped.items():
        if v != "naive":
            out[v].traces = ddp.trace.steps[-steps:]
    return out


def summarise(per_rank: Sequence[dict[str, VariantTiming]]) -> list[TimingRow]:
    """One row per variant, from every rank's :func:`time_ddp_variants` result."""
    medians = {
        v: statistics.median(max(steps) for steps in zip(*(r[v].step_seconds for r in per_rank)))
        for v in per_rank[0]
    }
    rows = []
    for v, median in medians.items():
        traces = per_rank[0][v].traces
        exposed = statistics.median(t.exposed_seconds for t in traces) if traces else float("nan")
        speedup = medians["naive"] / median if "naive" in medians else float("nan")
        rows.append(TimingRow(v, median, per_rank[0][v].collectives_per_step, speedup, exposed))
    return rows


def format_table(rows: Sequence[TimingRow]) -> str:
    """The rows as a fixed-width text table (milliseconds)."""
    header = (
        f"{'variant':<18} {'step (ms)':>10} {'collectives':>11} {'naive / this':>12} "
        f"{'exposed comm (ms)':>17}"
    )
    lines = [header]
    for r in rows:
        exposed = (
            "-" if math.isnan(r.exposed_comm_seconds) else f"{r.exposed_comm_seconds * 1e3:.1f}"
        )
        lines.append(
            f"{r.variant:<18} {r.median_seconds * 1e3:>10.1f} {r.collectives_per_step:>11} "
            f"{r.speedup_over_naive:>12.2f} {exposed:>17}"
        )
    return "\n".join(lines)
