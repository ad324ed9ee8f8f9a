"""distlab's TP x PP x DP run counted: what each rank of ``train_3d`` sends, and its time.

Pure Python, beside the planner. The mirror of
:func:`distlab.parallel.compose.three_d.train_3d` (the one in :mod:`distlab.parallel` runs
it on torch; this one counts it without torch):

* :func:`three_d_comm`: the bytes one rank of a pipeline stage sends per step, per
  process group, for a :class:`~distlab.core.layout.Layout` as ``train_3d`` runs it
  (plain DP or ZeRO-1, 1F1B or the interleaved schedule; :func:`check_three_d_layout`
  refuses by name what ``train_3d`` cannot set):
  :func:`distlab.calc.layout_comm.layout_comm` of that layout, plus what ``train_3d``
  sends outside the step; :func:`rank_volumes` for every rank;
* :func:`job_comm_totals`: those summed over the ranks per group and collective: the
  numbers a trace of one step must equal (:mod:`distlab.parallel.compose.traffic`);
* :func:`layout_step_time`: the planner's estimate of that one layout
  (:func:`distlab.calc.planner.evaluate`: compute at an assumed efficiency,
  TP and PP communication on the critical path, the 1F1B bubble, exposed DP
  communication) side by side with each group's communication time on the
  link its ranks get (:func:`distlab.sim.topology.group_link`: NVLink inside
  a node, the node's share of InfiniBand across nodes), from the same
  :func:`three_d_comm` volumes;
* :func:`gpt_spec`: the :class:`~distlab.calc.transformer.ModelSpec` of
  distlab's tiny GPT (:class:`distlab.models.GPTConfig`'s fields), and
  :func:`gpt_layer_buffers` the buffers each of its layers keeps.

It stays in :mod:`distlab.calc`, not beside ``train_3d``: :func:`layout_step_time`
prices these volumes next to the planner without importing torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distlab.core.checks import divides, int_in
from distlab.core.layout import Layout, check_layout
from distlab.core.ranks import group_array

from ..sim.topology import ClusterSpec, group_link
from .layout_comm import layout_comm
from .memory import get_recipe
from .planner import PlannerAssumptions, StepEstimate, evaluate
from .transformer import ModelSpec, rank_parameter_tensors
from .volume import CommPart, CommVolume

#: measured collective names for calc's ``send_recv`` parts
_MEASURED_NAME = {"send_recv": "send"}


def gpt_spec(*, vocab: int, seq_len: int, hidden: int, heads: int, layers: int,
             tie_embeddings: bool = True) -> ModelSpec:  # fmt: skip
    """distlab's tiny GPT (:class:`distlab.models.GPT`): GPT-2 layers, learned positions."""
    return ModelSpec("tiny GPT", layers, hidden, heads, vocab, seq_len,
                     tied_embeddings=tie_embeddings, source="distlab.models.GPT")  # fmt: skip


def gpt_layer_buffers(spec: ModelSpec) -> tuple[int, ...]:
    """Elements of the buffers each layer of distlab's tiny GPT keeps: its additive
    causal mask, ``seq_len x seq_len`` (broadcast with the parameters when ZeRO starts)."""
    return (spec.seq_len**2,)


def _pp_groups(layout: Layout) -> np.ndarray:
    """``layout``'s pipeline groups, ``(tp * dp, pp)`` ranks, stage s in column s (any
    ``order``; :func:`~distlab.core.ranks.group_array`, cheap for thousands of ranks)."""
    degrees = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp}
    return group_array(layout.world_size, "pp", order=layout.order, **degrees)


def check_three_d_layout(layout: object, who: str = "three_d_comm") -> Layout:
    """``layout`` if ``train_3d`` can run it, so that :func:`three_d_comm` can count it:
    tp, pp and dp with plain DP or ZeRO-1, any schedule and ``virtual_stages``, any
    ``order``. Else a ``TypeError`` (not a :class:`~distlab.core.layout.Layout`) or a
    ``ValueError`` naming the field ``train_3d`` has no setting for (``who`` names the
    caller in the message)."""
    layout = check_layout(layout)
    counted = f"{who} counts train_3d's TP x PP x DP run"
    for name in ("cp", "ep"):
        value = getattr(layout, name)
        if value > 1:
            raise ValueError(
                f"{counted}, which has no {name}: {name}={value} is not modelled here; use "
                f"{name}=1 (distlab.calc.layout_comm.layout_comm counts any layout's step)"
            )
    if layout.zero_stage not in (0, 1):
        raise ValueError(
            f"{counted}: zero_stage={layout.zero_stage} is not modelled here; allowed: "
            "zero_stage 0 (DDP) or 1 (ZeRO-1)"
        )
    if layout.sequence_parallel:
        raise ValueError(
            f"{counted}, which has no sequence parallelism: sequence_parallel=True is not "
            "modelled here; use sequence_parallel=False"
        )
    if layout.recompute != "none":
        raise ValueError(
            f"{counted}, which does not recompute: recompute={layout.recompute!r} is not "
            "modelled here; use recompute='none'"
        )
    return layout


def three_d_comm(
    spec: ModelSpec,
    layout: Layout,
    *,
    stage: int,
    bytes_per_element: int = 2,
    layer_buffers: Sequence[int] = (),
) -> dict[str, CommVolume]:
    """Bytes one rank of pipeline stage ``stage`` sends per step of a TP x PP x DP job,
    per process group, as :func:`distlab.parallel.compose.three_d.train_3d` reports it:
    ``layout`` counted by :func:`distlab.calc.layout_comm.layout_comm` (one formula per
    parallelism), plus what ``train_3d`` sends outside the step.

    ``spec`` is a :class:`~distlab.calc.transformer.ModelSpec`; ``layout`` a
    :class:`~distlab.core.layout.Layout` that ``train_3d`` can run
    (:func:`check_three_d_layout`: cp, ep, ``sequence_parallel``, ``recompute`` and
    ``zero_stage`` 2 or 3 are refused by name): ``layout.micro_batch`` sequences per
    micro-batch, ``layout.micro_batches`` (m) per replica, ``layout.virtual_stages`` (v)
    model chunks per rank for the interleaved schedule (1: 1F1B, GPipe or ZB-H1, which
    all send the same messages). Groups, always all four:

    * ``"tp"``: Megatron's all-reduces of the stage's ``layers / pp`` layers and the
      vocabulary-parallel embedding, head and loss;
    * ``"pp"``: stage s sends m (v - [s = p-1]) activations and m (v - [s = 0])
      gradients, the whole b x s x h tensor on every tp rank (Narayanan et al.
      2021, Section 2.2.2);
    * ``"embedding"``: with tied embeddings and pp > 1, the first and last stages
      swap their ``ceil(V/tp) x h`` parts of the embedding's gradient;
    * ``"dp"``: ``zero_stage=0`` one all-reduce of all the gradients as one flat buffer
      (:func:`~distlab.parallel.moe.layer.average_moe_gradients`); ``zero_stage=1``
      a reduce-scatter and an all-gather per padded flat group
      (:func:`~distlab.calc.buckets.zero_flat_groups`; Rajbhandari et al. 2020,
      Section 7.2.1). Outside the step: with ZeRO-1, **once per run**, the broadcast
      of every parameter and buffer (``layer_buffers``: elements of each layer's
      buffers, such as distlab's GPT's causal mask) when the optimizer is built
      (:func:`~distlab.parallel.comm.collectives.broadcast_module_state`): a trace of k steps
      holds k times the other parts and this one once; and on the last stage the
      all-reduce of the loss (one float64) for the step's report.

    Not modelled here: the shape headers distlab's pipeline executor sends before
    each tensor (8 int64, 64 bytes; ``layout_comm(headers=True)`` counts them), and
    the one-time checks when the model is built. Empty volumes for groups of one rank.
    """
    layout = check_three_d_layout(layout)
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    stage = int_in("stage", stage, 0, pp - 1)
    divides("pp * virtual_stages", pp * layout.virtual_stages, "layers", spec.layers)
    bpe = bytes_per_element
    rank = int(_pp_groups(layout)[0, stage])  # a rank of that stage, in any order
    volumes = layout_comm(spec, layout, rank, bytes_per_element=bpe, headers=False)
    dp_parts = volumes["dp"].parts if "dp" in volumes else ()
    if dp > 1 and layout.zero_stage == 1:
        tensors = rank_parameter_tensors(spec, tp=tp, pp=pp, stage=stage)
        buffers = tuple(layer_buffers) * (spec.layers // pp)
        dp_parts += _setup_broadcasts(tensors + buffers, dp=dp, bytes_per_element=bpe)
    if dp > 1 and stage == pp - 1:
        dp_parts += (CommPart("loss average (float64)", "all_reduce", dp, 8),)
    names = {"tp": "tensor parallel", "pp": "pipeline parallel", "embedding": "tied embedding"}
    out = {g: CommVolume(n, volumes[g].parts if g in volumes else ()) for g, n in names.items()}
    return {**out, "dp": CommVolume("data parallel", dp_parts)}


def _setup_broadcasts(tensors, *, dp: int, bytes_per_element: int) -> tuple[CommPart, ...]:
    """One broadcast per parameter and buffer when ZeRO is built: once per run."""
    what = "broadcast at construction (once per run), {}-element tensors"
    sizes = Counter(t for t in tensors if t)  # empty tensors are not broadcast
    return tuple(
        CommPart(what.format(size), "broadcast", dp, size * bytes_per_element, n)
        for size, n in sorted(sizes.items())
    )


def rank_volumes(
    spec: ModelSpec, layout: Layout, *, bytes_per_element: int = 4,
    layer_buffers: Sequence[int] = (),
) -> list[dict[str, CommVolume]]:  # fmt: skip
    """:func:`three_d_comm` of every rank of ``layout``, in rank order (each rank's
    pipeline stage from ``layout.order``; Megatron's default numbering puts rank r
    on stage r // (tp * dp))."""
    layout = check_three_d_layout(layout, "rank_volumes")
    per_stage = [
        three_d_comm(spec, layout, stage=s, bytes_per_element=bytes_per_element,
                     layer_buffers=layer_buffers)
        for s in range(layout.pp)
    ]  # fmt: skip
    stage_of = [0] * layout.world_size
    for group in _pp_groups(layout).tolist():
        for stage, rank in enumerate(group):
            stage_of[rank] = stage
    return [per_stage[stage] for stage in stage_of]


@dataclass
class Totals:
    """Calls, payload bytes and wire bytes of one (group, collective), summed over ranks."""

    calls: float = 0
    payload_bytes: float = 0
    wire_bytes: float = 0


def job_comm_totals(volumes: list[dict[str, CommVolume]]) -> dict[tuple[str, str], Totals]:
    """Sum per (group, collective) over ranks. A ``send_recv`` part counts as ``"send"``
    on its rank, and every message sent is received: ``"recv"`` rows with the same
    calls and payload and no wire bytes (a receive sends nothing)."""
    totals: dict[tuple[str, str], Totals] = {}
    for rank_volume in volumes:
        for group, volume in rank_volume.items():
            for part in volume.parts:
                name = _MEASURED_NAME.get(part.collective, part.collective)
                t = totals.setdefault((group, name), Totals())
                t.calls += part.count
                t.payload_bytes += part.payload_bytes * part.count
                t.wire_bytes += part.bytes_sent
    for (group, name), t in list(totals.items()):
        if name == "send":
            totals[(group, "recv")] = Totals(t.calls, t.payload_bytes, 0)
    return totals


@dataclass(frozen=True)
class LayoutTime:
    """The planner's step estimate and the simulator's per-group communication times."""

    estimate: StepEstimate
    group_seconds: dict[str, float]  # per group: its traffic on its link (slowest rank)
    group_links: dict[str, str]
    fits: bool  # memory.total within the GPU's memory less the planner's headroom


def layout_step_time(
    spec: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    assumptions: PlannerAssumptions | None = None,
) -> LayoutTime:
    """Step time of one ``layout`` on ``cluster`` (e.g. ``preset("dgx-h100", nodes=1)``).

    The planner side is :func:`~distlab.calc.planner.evaluate` of ``layout`` as given
    (ZeRO off, no recompute; with 1F1B ``(m + (p-1)) x (compute + TP + PP per
    micro-batch) + exposed DP``), in the recipe of ``assumptions`` (bf16 with Adam by
    default; Narayanan et al. 2021, Section 2.2 for the bubble); set
    ``sequence_parallel=True`` (tp > 1) to price Megatron's run, as the planner's
    search does. The simulator side is, for each group, the busiest rank's
    :func:`three_d_comm` volume of ``train_3d``'s run of the same layout, which has no
    sequence parallelism (``layout`` with ``sequence_parallel=False``), in the same
    element size, run one collective after another on the group's link (:meth:`~distlab.calc.volume.CommVolume.time_on`:
    messages x alpha + bytes / bandwidth, Hockney 1994). The per-group times count
    whole steps, not one micro-batch, and do not overlap anything: compare them with
    the planner's ``tp_comm_s``, ``pp_comm_s`` and ``dp_comm_s``. The planner uses one
    gradient all-reduce (one bucket) and Megatron's 1/tp pipeline sends;
    ``three_d_comm`` counts distlab's run: one all-reduce of the gradients as one flat
    buffer, as the planner's, and whole activations per tp rank.

    Both sides must model ``layout``: a ``ValueError`` names ``zero_stage`` (ZeRO off
    only: ZeRO-1's once-per-run broadcast is not a step's), cp, ep or ``recompute``
    (:func:`check_three_d_layout`: ``train_3d`` has none of them). Any ``order`` (the
    groups and their links follow it), schedule and ``virtual_stages``.
    """
    layout = check_layout(layout)
    if layout.zero_stage:
        raise ValueError(
            f"layout_step_time compares plain DP: zero_stage={layout.zero_stage} is not "
            "modelled here (three_d_comm's ZeRO-1 broadcast is once per run, not per step); "
            "use zero_stage=0"
        )
    run = check_three_d_layout(layout.with_(sequence_parallel=False), "layout_step_time")
    a = assumptions or PlannerAssumptions()
    estimate = evaluate(spec, cluster, layout, assumptions=a)
    bpe = get_recipe(a.recipe).grad_bytes
    volumes = rank_volumes(spec, run, bytes_per_element=bpe)
    world, order = layout.world_size, layout.order
    degrees = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp}
    links = {
        d: group_link(cluster, group_array(world, d, order=order, **degrees))
        for d in ("tp", "pp", "dp")
    }
    ends = _pp_groups(layout)[:, [0, -1]]  # first and last stage of each pipeline
    links["embedding"] = group_link(cluster, ends) if layout.pp > 1 else None
    seconds, names = {}, {}
    for group, link in links.items():
        names[group] = link.name if link is not None else "-"
        busiest = max(volumes, key=lambda v, g=group: v[g].total)[group]
        seconds[group] = busiest.time_on(link) if link is not None and busiest.parts else 0.0
    fits = estimate.memory.total <= cluster.gpu_memory_bytes * (1 - a.memory_headroom)
    return LayoutTime(estimate, seconds, names, fits)


def format_layout_time(name: str, lt: LayoutTime) -> str:
    """Planner terms and the simulator's per-group times, one line each (microseconds)."""
    e = lt.estimate

    def us(x: float) -> str:
        return f"{x * 1e6:12.1f} us"

    planner = {
        "compute": e.compute_s, "bubble": e.bubble_s, "tp": e.tp_comm_s,
        "pp": e.pp_comm_s, "dp (exposed)": e.dp_comm_s, "step": e.step_s,
    }  # fmt: skip
    fits = "fits" if lt.fits else "does NOT fit (with the planner's headroom)"
    title = f"{name}: {e.layout.label()}, {e.memory.total / 1e9:.2f} GB/GPU ({fits}), "
    lines = [title + f"{e.mfu:.1%} MFU (planner)"]
    lines += [f"  planner {what:<13}{us(s)}" for what, s in planner.items()]
    lines += [
        f"  sim     {group:<13}{us(s)}  on {lt.group_links[group]}"
        for group, s in lt.group_seconds.items()
    ]
    return "\n".join(lines)
