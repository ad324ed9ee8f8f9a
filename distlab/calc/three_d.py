"""A TP x PP x DP layout's traffic per group and its step time on a modelled cluster.

Pure Python. Three questions about one layout (tp, pp, dp, micro-batches):

* :func:`job_comm_totals`: what every rank of the job sends, per group and
  collective, summed over the ranks (:func:`distlab.calc.comm.three_d_comm`
  for each rank's pipeline stage, with plain DP or ZeRO-1 and 1F1B or the
  interleaved schedule): the numbers a trace of one step must equal;
* :func:`layout_step_time`: the planner's estimate of that one layout
  (:func:`distlab.calc.planner.evaluate`: compute at an assumed efficiency,
  TP and PP communication on the critical path, the 1F1B bubble, exposed DP
  communication) side by side with each group's communication time on the
  link its ranks get (:func:`distlab.sim.topology.group_link`: NVLink inside
  a node, the node's share of InfiniBand across nodes), from the same
  :func:`~distlab.calc.comm.three_d_comm` volumes;
* :func:`gpt_spec`: the :class:`~distlab.calc.transformer.ModelSpec` of
  distlab's tiny GPT (:class:`distlab.models.GPTConfig`'s fields), and
  :func:`gpt_layer_buffers` the buffers each of its layers keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sim.topology import ClusterSpec, group_link
from .comm import CommVolume, three_d_comm
from .planner import ParallelConfig, PlannerAssumptions, StepEstimate, evaluate
from .transformer import ModelSpec

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


def rank_volumes(
    spec: ModelSpec, *, tp: int, pp: int, dp: int, micro_batch: int, micro_batches: int,
    bytes_per_element: int = 4, zero_stage: int = 0, chunks: int = 1,
    layer_buffers: tuple[int, ...] = (),
) -> list[dict[str, CommVolume]]:  # fmt: skip
    """:func:`~distlab.calc.comm.three_d_comm` of every rank, in rank order
    (Megatron's numbering: pipeline stage = rank // (tp * dp))."""
    per_stage = [
        three_d_comm(spec, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                     micro_batches=micro_batches, stage=s, bytes_per_element=bytes_per_element,
                     zero_stage=zero_stage, chunks=chunks, layer_buffers=layer_buffers)
        for s in range(pp)
    ]  # fmt: skip
    return [per_stage[rank // (tp * dp)] for rank in range(tp * pp * dp)]


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
    *,
    tp: int,
    pp: int,
    dp: int,
    micro_batch: int,
    micro_batches: int,
    assumptions: PlannerAssumptions | None = None,
) -> LayoutTime:
    """Step time of one layout on ``cluster`` (e.g. ``preset("dgx-h100", nodes=1)``).

    The planner side (:func:`~distlab.calc.planner.evaluate`, ZeRO off, no
    recompute, 1F1B) is ``(m + (p-1)) x (compute + TP + PP per micro-batch)
    + exposed DP``, in the recipe of ``assumptions`` (bf16 with Adam by
    default; Narayanan et al. 2021, Section 2.2 for the bubble). The
    simulator side is, for each group, the busiest rank's
    :func:`~distlab.calc.comm.three_d_comm` volume in the same element size
    run one collective after another on the group's link
    (:meth:`~distlab.calc.comm.CommVolume.time_on`: messages x alpha + bytes /
    bandwidth, Hockney 1994). The per-group times count whole steps, not one
    micro-batch, and do not overlap anything: compare them with the planner's
    ``tp_comm_s``, ``pp_comm_s`` and ``dp_comm_s``. The planner uses one
    gradient all-reduce (one bucket) and Megatron's 1/tp pipeline sends;
    ``three_d_comm`` counts distlab's run: one all-reduce per tensor (more
    alpha terms) and whole activations per tp rank.
    """
    a = assumptions or PlannerAssumptions()
    config = ParallelConfig(tp, pp, dp, 0, micro_batch, micro_batches, "none")
    estimate = evaluate(spec, cluster, config, assumptions=a)
    from distlab.core.ranks import group_array

    from .memory import get_recipe

    bpe = get_recipe(a.recipe).grad_bytes
    volumes = rank_volumes(spec, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                           micro_batches=micro_batches, bytes_per_element=bpe)  # fmt: skip
    world, degrees = tp * pp * dp, {"tp": tp, "pp": pp, "dp": dp}
    links = {d: group_link(cluster, group_array(world, d, **degrees)) for d in ("tp", "pp", "dp")}
    ends = [[r, r + (pp - 1) * tp * dp] for r in range(tp * dp)]  # first and last stage
    links["embedding"] = group_link(cluster, ends) if pp > 1 else None
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
    title = f"{name}: {e.config.label()}, {e.memory.total / 1e9:.2f} GB/GPU ({fits}), "
    lines = [title + f"{e.mfu:.1%} MFU (planner)"]
    lines += [f"  planner {what:<13}{us(s)}" for what, s in planner.items()]
    lines += [
        f"  sim     {group:<13}{us(s)}  on {lt.group_links[group]}"
        for group, s in lt.group_seconds.items()
    ]
    return "\n".join(lines)
