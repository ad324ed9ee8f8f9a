"""Pipeline bubbles: the closed forms, and the schedules they come from.

With p stages and m micro-batches, GPipe (Huang et al. 2019) and 1F1B
(PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", Section 2.2.1) leave each
stage idle for (p-1) forward+backward slots per step, while the ideal step
is m slots:

* bubble / ideal time   = (p - 1) / m
* bubble / total time   = (p - 1) / (m + p - 1)

The interleaved schedule (Section 2.2.2) gives each rank v model chunks
("virtual stages"); a slot is v times shorter, so the bubble shrinks by v:
(p - 1) / (v m) of the ideal time, at v times more point-to-point traffic.

Zero-bubble ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism",
Section 3.1) splits the backward into the input gradient I (time T_I, the
paper's T_B) and the weight gradient W (T_W) and delays the W's into the
idle slots: the bubble per rank drops from (p-1)(T_F + T_I + T_W) to
(p-1)(T_F + T_I - T_W) (:func:`zb_h1_bubble_time`), with 1F1B's memory.

The schedules themselves are data, one type for the whole library
(:mod:`distlab.core.pipeline_schedule`): :func:`schedule_ops` builds one,
:func:`replay` (:mod:`distlab.sim.pipeline_replay`) times it with dependencies, and the bubble counted from the
timeline equals the formulas here (the tests check it). GPipe keeps all m
micro-batches' activations; 1F1B keeps at most p on the first stage
(:func:`in_flight_micro_batches`).
"""

from __future__ import annotations

from distlab.core.checks import choice, positive, positive_int
from distlab.core.pipeline_schedule import GENERATORS, Schedule, build
from distlab.sim.pipeline_replay import Timeline, replay

SCHEDULES = tuple(GENERATORS)  # "gpipe", "1f1b", "interleaved", "zb_h1"
RELATIVE_TO = ("total", "ideal")


def _check(stages: int, micro_batches: int, schedule: str, virtual_stages: int) -> tuple:
    p = positive_int("stages", stages)
    m = positive_int("micro_batches", micro_batches)
    choice("schedule", schedule, SCHEDULES)
    v = positive_int("virtual_stages", virtual_stages)
    if schedule != "interleaved" and v != 1:
        raise ValueError(
            f"virtual_stages={v} needs schedule='interleaved' (got {schedule!r}); "
            "gpipe, 1f1b and zb_h1 have one model chunk per rank"
        )
    return p, m, v


def bubble_fraction(
    stages: int,
    micro_batches: int,
    *,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    relative_to: str = "total",
) -> float:
    """Idle share of a pipeline step (Narayanan et al. 2021, Section 2.2).

    ``relative_to="total"``: (p-1) / (v m + p - 1), the idle fraction of the
    step's wall time; ``relative_to="ideal"``: (p-1) / (v m), the bubble time
    divided by the ideal (bubble-free) compute time, the paper's form. v = 1
    for ``"gpipe"`` and ``"1f1b"`` (same bubble; 1F1B needs less memory).

    ``"zb_h1"`` under Qi et al.'s assumption T_F = T_I = T_W (Section 3.1):
    bubble (p-1) T_F against an ideal 3 m T_F, so (p-1)/(3m) of the ideal and
    (p-1)/(3m + p - 1) of the step; the closed form needs m >= p. Other costs:
    :func:`zb_h1_bubble_time`.
    """
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    choice("relative_to", relative_to, RELATIVE_TO)
    if schedule == "zb_h1":
        _zb_needs_enough_micro_batches(p, m)
        return (p - 1) / (3 * m) if relative_to == "ideal" else (p - 1) / (3 * m + p - 1)
    if relative_to == "ideal":
        return (p - 1) / (v * m)
    return (p - 1) / (v * m + p - 1)


def in_flight_micro_batches(
    stages: int, micro_batches: int, *, schedule: str = "1f1b", virtual_stages: int = 1
) -> float:
    """Micro-batches whose activations the first stage holds at its peak.

    Counted in micro-batches' worth of that rank's layers (L/p):

    * GPipe: m (every forward runs before any backward);
    * 1F1B: min(p, m) (the first stage runs p - 1 warm-up forwards, then one more
      before its first backward); ZB-H1 the same (Qi et al. 2024, Section 3.1:
      activations count until the input-gradient pass I; a pending W keeps only
      the smaller inputs of its weight gradients);
    * interleaved: min(m, p + (p-1)/v). Megatron-LM's first rank runs
      2(p-1) + (v-1)p warm-up forwards of chunks holding L/(pv) layers, one
      more before its first backward: (vp + p - 1) chunks, i.e. the factor
      1 + (p-1)/(pv) of Korthikanti et al. 2022, Section 4.2.3.
    """
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    if schedule == "gpipe":
        return m
    if schedule in ("1f1b", "zb_h1"):
        return min(p, m)
    return min(m * v, v * p + p - 1) / v


def zb_h1_bubble_time(
    stages: int, *, forward_time: float, input_grad_time: float, weight_grad_time: float
) -> float:
    """ZB-H1's idle time per rank per step, (p-1)(T_F + T_I - T_W) (Qi et al. 2024,
    Section 3.1, with T_I the paper's T_B), for m >= p micro-batches and
    T_W <= T_F + T_I. 1F1B's is (p-1)(T_F + T_I + T_W)."""
    p = positive_int("stages", stages)
    t_f, t_i = positive("forward_time", forward_time), positive("input_grad_time", input_grad_time)
    t_w = positive("weight_grad_time", weight_grad_time)
    if t_w > t_f + t_i:
        raise ValueError(
            f"weight_grad_time={t_w} exceeds forward_time + input_grad_time = {t_f + t_i}; "
            "the ZB-H1 closed form assumes T_W <= T_F + T_I"
        )
    return (p - 1) * (t_f + t_i - t_w)


def _zb_needs_enough_micro_batches(p: int, m: int) -> None:
    if m < p:
        raise ValueError(
            f"ZB-H1's closed form needs micro_batches >= stages (Qi et al. 2024 assume m >= p); "
            f"got micro_batches={m}, stages={p}: replay(schedule_ops(...)) gives the bubble"
        )


def schedule_ops(
    stages: int, micro_batches: int, *, schedule: str = "1f1b", virtual_stages: int = 1
) -> Schedule:
    """The :class:`~distlab.core.pipeline_schedule.Schedule` these formulas describe
    (``build`` from :mod:`distlab.core.pipeline_schedule` with this module's argument names)."""
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    return build(schedule, p, m, chunks=v)


__all__ = [
    "RELATIVE_TO",
    "SCHEDULES",
    "Schedule",
    "Timeline",
    "bubble_fraction",
    "in_flight_micro_batches",
    "replay",
    "schedule_ops",
    "zb_h1_bubble_time",
]
