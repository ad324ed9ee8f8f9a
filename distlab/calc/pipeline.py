"""Pipeline bubbles: the closed forms, and the schedules they come from.

With p stages and m micro-batches, GPipe (Huang et al. 2019, Figure 2c) and 1F1B
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
Section 2.1; its bubble in Section 2.3, Table 2) splits the backward into the input gradient I (time T_I, the
paper's T_B) and the weight gradient W (T_W) and delays the W's into the
idle slots: the bubble per rank drops from (p-1)(T_F + T_I + T_W) to
(p-1)(T_F + T_I - T_W) (:func:`zb_h1_bubble_time`), with 1F1B's memory.

Beyond ZB-H1 (each built in :mod:`distlab.core.pipeline_schedule`; the
fractions below are for T_F = T_I = T_W, one synchronous step, and the tests
check each against the replay):

* ZB-H2 (Qi et al., Section 2.2): more warm-up forwards, 2p - 1 micro-batches
  in flight on the first rank. Every rank is busy from its first action to
  its last, so the paper's bubble (p-1)(T_F + T_I - 2 T_W), zero at equal
  costs, is reached when each rank starts its next step as soon as it is done
  (:attr:`~distlab.sim.pipeline_replay.Timeline.span_bubble_fraction`); within
  one synchronous step the ranks' staggered starts and ends still cost
  (p-1)/(3m + p - 1), as ZB-H1.
* ZB-V (Qi et al., Section 6) and DualPipeV (Sea AI Lab's "cut-in-half" of DualPipe,
  as the README of DeepSeek's DualPipe repository credits it): two chunks
  per rank in a V. A chunk is half a stage, so the staggered start and end
  cost half as much: (p-1)/(6m + p - 1) of the step, with p (ZB-V) or
  p + 1/2 (DualPipeV) micro-batches' activations on the first rank. The
  DeepSeek-V3 report's own count for DualPipe (Table 2), which the DualPipe
  repository gives for DualPipeV too, (PP/2 - 1)(F&B + B - 3W)
  (:func:`dualpipe_bubble_time`), is twice the replay's idle time; DeepSeek's
  code posts a chunk's sends with the next chunk's receives in one
  ``batch_isend_irecv`` and waits on it before computing.
* DualPipe (DeepSeek-AI 2024, DeepSeek-V3 report Section 3.2.1): two copies of the model,
  micro-batches entering from both ends; each rank runs a whole stage of each copy, so the staggered
  ends cost as for the V but over p - 2 ranks' worth: (p-2)/(6m + p - 2) of the
  step, with p + 1 micro-batches' activations on the first rank and twice the
  parameters.
* Breadth-first looping (Lamy-Poirier 2023): the interleaved bubble
  (p-1)/(v m + p - 1) with GPipe's memory (m micro-batches in flight).

The schedules themselves are data, one type for the whole library
(:mod:`distlab.core.pipeline_schedule`): :func:`schedule_ops` builds one,
:func:`replay` (:mod:`distlab.sim.pipeline_replay`) times it with dependencies, and the bubble counted from the
timeline equals the formulas here (the tests check it). GPipe keeps all m
micro-batches' activations; 1F1B keeps at most p on the first stage
(:func:`in_flight_micro_batches`).

The closed forms build no schedule, so they answer at once for any p and m
(``bubble_fraction(10**11, 8)``); a schedule lists every action and is built
for bounded sizes only (:func:`schedule_ops`).
"""

from __future__ import annotations

from distlab.core.checks import choice, positive, positive_int
from distlab.core.pipeline_schedule import (
    GENERATORS,
    LOOPING,
    V_SHAPED,
    PipelineSchedule,
    build,
    check_v_shape,
)
from distlab.core.renamed import old_names
from distlab.sim.pipeline_replay import Timeline, replay

SCHEDULES = tuple(GENERATORS)  # gpipe, 1f1b, interleaved, zb_h1, zb_h2, zb_v, dualpipe_v, ...
RELATIVE_TO = ("total", "ideal")


def _check(stages: int, micro_batches: int, schedule: str, virtual_stages: int) -> tuple:
    """(p, m, v): v is the chunks per rank, ``virtual_stages`` for a looping schedule,
    2 for a V-shaped one (``virtual_stages`` 1 or 2), else 1."""
    p = positive_int("stages", stages)
    m = positive_int("micro_batches", micro_batches)
    choice("schedule", schedule, SCHEDULES)
    v = positive_int("virtual_stages", virtual_stages)
    if schedule in V_SHAPED and v in (1, 2):
        return p, m, 2
    if schedule not in LOOPING and v != 1:
        raise ValueError(
            f"virtual_stages={v} needs a looping schedule ({', '.join(LOOPING)}), got "
            f"{schedule!r}; the V-shaped {', '.join(V_SHAPED)} always have 2 chunks, the others 1"
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

    ``"zb_h1"`` under Qi et al.'s assumption T_F = T_I = T_W (Sections 2.1 and 2.3):
    bubble (p-1) T_F against an ideal 3 m T_F, so (p-1)/(3m) of the ideal and
    (p-1)/(3m + p - 1) of the step; the closed form needs m >= p. Other costs:
    :func:`zb_h1_bubble_time`. ``"zb_h2"``: the same within one synchronous step
    (see the module docstring for why).

    ``"zb_v"`` and ``"dualpipe_v"`` at T_F = T_I = T_W: each rank idles half a
    forward per stage before it starts and after it ends, (p-1) T_F / 2 against
    an ideal 3 m T_F: (p-1)/(6m) of the ideal, (p-1)/(6m + p - 1) of the step.
    ``"dualpipe"`` at T_F = T_I = T_W: (p-2) T_F / 2 per rank, (p-2)/(6m) of the
    ideal and (p-2)/(6m + p - 2) of the step (the replay's count; DeepSeek's table,
    :func:`dualpipe_bubble_time`, counts twice that idle time).
    ``"breadth_first"``: as ``"interleaved"`` with v = ``virtual_stages``.
    """
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    choice("relative_to", relative_to, RELATIVE_TO)
    if schedule in ("zb_h1", "zb_h2"):
        _zb_needs_enough_micro_batches(p, m)
        return (p - 1) / (3 * m) if relative_to == "ideal" else (p - 1) / (3 * m + p - 1)
    if schedule in V_SHAPED:
        check_v_shape(schedule, p, m)  # names an m too small for the schedule
        k = p - 2 if schedule == "dualpipe" else p - 1
        return k / (6 * m) if relative_to == "ideal" else k / (6 * m + k)
    if schedule == "breadth_first" and m < p:
        raise ValueError(
            f"the breadth-first closed form needs micro_batches >= stages (a chunk's round "
            f"must outlast the trip around the ranks); got micro_batches={m}, stages={p}: "
            "replay(schedule_ops(...)) gives the bubble"
        )
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
      before its first backward); ZB-H1 the same (Qi et al. 2024, Section 2.1:
      activations count until the input-gradient pass I; a pending W keeps only
      the smaller inputs of its weight gradients);
    * interleaved: min(m, p + (p-1)/v). Megatron-LM's first rank runs
      2(p-1) + (v-1)p warm-up forwards of chunks holding L/(pv) layers, one
      more before its first backward: (vp + p - 1) chunks, i.e. the factor
      1 + (p-1)/(pv) of Korthikanti et al. 2022, Section 4.2.3;
    * ZB-H2: min(2p - 1, m), its 2p - 1 warm-up forwards (Qi et al. 2024, Section 2.2);
    * ZB-V: p, as 1F1B: 2p chunks of L/(2p) layers (Qi et al. 2024, Section 6);
    * DualPipeV: p + 1/2: 2p + 1 chunks of L/(2p) layers (the PP + 1 chunks that
      DeepSeek's DualPipe repository gives it, with chunks of half a stage);
    * DualPipe: p + 1, the report's PP + 1 (each chunk a whole stage of one copy);
    * breadth-first: m, as GPipe (every forward before any backward).
    """
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    if schedule in ("gpipe", "breadth_first"):
        return m
    if schedule in ("1f1b", "zb_h1"):
        return min(p, m)
    if schedule == "zb_h2":
        return min(2 * p - 1, m)
    if schedule in V_SHAPED:
        check_v_shape(schedule, p, m)  # names an m too small for the schedule
        return {"zb_v": p, "dualpipe_v": p + 0.5, "dualpipe": p + 1}[schedule]
    return min(m * v, v * p + p - 1) / v


def chunk_switches(
    stages: int, micro_batches: int, *, schedule: str, virtual_stages: int = 2, rank: int = 0
) -> int:
    """How often ``rank`` moves from one model chunk to another in one step of
    ``schedule`` (:meth:`~distlab.core.pipeline_schedule.PipelineSchedule.chunk_switches`): each
    move gathers the next chunk's weights again under ZeRO-3/FSDP. Breadth-first (Lamy-Poirier
    2023): 2v - 2, whatever m; depth-first (``"interleaved"``): more as m grows."""
    return build(schedule, stages, micro_batches, chunks=virtual_stages).chunk_switches(rank)


def zb_h1_bubble_time(
    stages: int, *, forward_time: float, input_grad_time: float, weight_grad_time: float
) -> float:
    """ZB-H1's idle time per rank per step, (p-1)(T_F + T_I - T_W) (Qi et al. 2024,
    Section 2.3, Table 2, with T_I the paper's T_B), for m >= p micro-batches and
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


def zb_h2_bubble_time(
    stages: int, *, forward_time: float, input_grad_time: float, weight_grad_time: float
) -> float:
    """ZB-H2's idle time per rank inside its own busy span, (p-1)(T_F + T_I - 2 T_W)
    (Qi et al. 2024, Section 2.3, Table 2, T_I being the paper's T_B), floored
    at 0: the step's bubble when consecutive steps overlap (the paper's optimizer
    post-validation); :attr:`~distlab.sim.pipeline_replay.Timeline.span_bubble_fraction`
    measures it on a replay."""
    p = positive_int("stages", stages)
    t_f, t_i = positive("forward_time", forward_time), positive("input_grad_time", input_grad_time)
    t_w = positive("weight_grad_time", weight_grad_time)
    return max(0.0, (p - 1) * (t_f + t_i - 2 * t_w))


def dualpipe_bubble_time(
    stages: int, *, overlapped_time: float, backward_time: float, weight_grad_time: float
) -> float:
    """DualPipe's bubble per rank as the DeepSeek-V3 report counts it (Table 2), and
    DualPipeV's as DeepSeek's DualPipe repository does (the same expression): (PP/2 - 1)(F&B + B - 3W), PP the number of pipeline
    stages, F&B (``overlapped_time``) one forward chunk overlapped with one backward
    chunk, B a whole backward chunk, W its weight part. With F&B = F + B (no overlap,
    as on this course's executor) and F = B/2 = W this is (PP/2 - 1) 2 F, twice the
    idle time :func:`distlab.sim.pipeline_replay.replay` finds, sending each message
    as soon as it is made. DeepSeek's code (``dualpipe/dualpipev.py``,
    ``_commit_and_wait_comm``) posts a chunk's sends together with the receives of
    the rank's next chunk in one ``batch_isend_irecv`` and waits on it before computing."""
    pp = positive_int("stages", stages)
    f_and_b = positive("overlapped_time", overlapped_time)
    b, w = positive("backward_time", backward_time), positive("weight_grad_time", weight_grad_time)
    return (pp / 2 - 1) * (f_and_b + b - 3 * w)


def _zb_needs_enough_micro_batches(p: int, m: int) -> None:
    if m < p:
        raise ValueError(
            f"ZB-H1's and ZB-H2's closed form needs micro_batches >= stages (Qi et al. 2024 assume m >= p); "
            f"got micro_batches={m}, stages={p}: replay(schedule_ops(...)) gives the bubble"
        )


def schedule_ops(
    stages: int, micro_batches: int, *, schedule: str = "1f1b", virtual_stages: int = 1
) -> PipelineSchedule:
    """The :class:`~distlab.core.pipeline_schedule.PipelineSchedule` these formulas describe
    (``build`` from :mod:`distlab.core.pipeline_schedule` with this module's argument names).
    A schedule lists every action, so it is built for at most
    :data:`~distlab.core.pipeline_schedule.MAX_STAGES` stages and
    :data:`~distlab.core.pipeline_schedule.MAX_SLOTS` slots (stages x micro-batches x
    chunks); larger sizes are a ``ValueError`` naming the limit. The closed forms above
    build nothing and take any size."""
    p, m, v = _check(stages, micro_batches, schedule, virtual_stages)
    return build(schedule, p, m, chunks=v)


__all__ = [
    "RELATIVE_TO",
    "SCHEDULES",
    "PipelineSchedule",
    "Timeline",
    "bubble_fraction",
    "dualpipe_bubble_time",
    "in_flight_micro_batches",
    "replay",
    "schedule_ops",
    "zb_h1_bubble_time",
    "zb_h2_bubble_time",
]


# the old name, which notebooks from older releases still import from here
__getattr__ = old_names(__name__, {"Schedule": PipelineSchedule})
