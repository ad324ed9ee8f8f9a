"""Choose a 3D-parallel layout: enumerate (TP, PP, DP, ZeRO, micro-batches, recompute), rank by step time.

Given a model, a cluster and a global batch (in sequences), :func:`plan`
lists every layout (a :class:`distlab.core.layout.Layout`, the object the
placer places and the runner runs) that uses all GPUs (tp x pp x dp = GPUs), fits in GPU
memory (:func:`~distlab.calc.memory.peak_bytes`), and estimates its step
time from first principles:

* **compute**: the model's FLOPs (6N + 12 l h s per token, PaLM Appendix B)
  plus recomputation, spread over tp x pp GPUs per replica, at
  ``compute_efficiency`` of the GPU's peak (an assumption, 0.5 by default;
  Korthikanti et al. 2022 report 54.2% MFU for a 530B model on 2240 A100s);
* **tensor parallelism**: 4 all-reduces (6 with full recompute) of b x s x h
  per layer and micro-batch (:func:`~distlab.calc.comm.tensor_parallel_comm`),
  on the critical path;
* **pipeline**: point-to-point sends per micro-batch, and the bubble: the
  step takes (m + (p-1)/v) micro-batch slots (Narayanan et al. 2021, Section 2.2);
* **data parallelism / ZeRO**: the gradient and parameter collectives
  (:func:`~distlab.calc.comm.data_parallel_comm`; all-reduces pay the
  smaller of a ring's and a tree's latency, as NCCL switches to trees at
  scale), of which ``dp_overlap`` is hidden behind compute (0 by default:
  a pessimistic bound).

Each collective runs on the link its group uses. Ranks are numbered as
Megatron-LM does (:mod:`distlab.core.ranks`: tp fastest, then dp, then
pp) and fill nodes in order, so a group of ``size`` ranks ``stride`` apart
stays inside one NVLink domain when stride x size divides the GPUs per domain;
otherwise it crosses the network, where each GPU gets its share of the node's NICs.
That is why TP (the chattiest: every layer, every micro-batch) belongs inside
a node, and :meth:`Plan.explain` shows the numbers.

Rules the enumeration follows: tp divides the heads (and key/value heads),
pp divides the layers, dp divides the global batch; ZeRO stages 2 and 3 are
not combined with pipeline parallelism (with many micro-batches they would
reduce-scatter gradients or gather parameters every micro-batch; DeepSpeed's
pipeline engine allows only stage 1, and Megatron-LM's distributed optimizer
is stage 1); sequence parallelism is on whenever tp > 1 (same traffic, less
activation memory); the interleaved schedule needs m to be a multiple of p
and v to divide the layers per stage. Pure Python; 16,384 GPUs enumerate in
well under a second (``benchmarks/planner_scale.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache

from distlab.core.checks import divisors, fraction, positive, positive_int
from distlab.core.layout import Layout, check_layout
from distlab.core.ranks import group_array
from distlab.core.units import GB, format_seconds

from ..sim.topology import ClusterSpec, Link, network_link
from ..sim.topology import group_link as topology_group_link
from .comm import data_parallel_comm, pipeline_parallel_comm, tensor_parallel_comm
from .flops import model_flops_per_token, recompute_overhead
from .memory import PeakMemory, get_recipe, peak_bytes
from .pipeline import bubble_fraction
from .transformer import ModelSpec, model_preset


@dataclass(frozen=True)
class PlannerAssumptions:
    """What the estimate assumes, and which options :func:`plan` enumerates.

    ``distlab plan`` sets the first four with ``--compute-efficiency``,
    ``--dp-overlap``, ``--headroom`` and ``--recipe``."""

    compute_efficiency: float = 0.5
    dp_overlap: float = 0.0
    memory_headroom: float = 0.1
    recipe: str = "mixed_adam"
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    virtual_stages: tuple[int, ...] = (1, 2, 4)
    max_tp: int | None = None

    def __post_init__(self) -> None:
        if fraction("compute_efficiency", self.compute_efficiency) == 0:
            raise ValueError("compute_efficiency must be > 0")
        fraction("dp_overlap", self.dp_overlap)
        fraction("memory_headroom", self.memory_headroom, allow_one=False)
        get_recipe(self.recipe)


@dataclass(frozen=True)
class StepEstimate:
    """The estimated memory and step time of one :class:`~distlab.core.layout.Layout`
    (seconds, bytes)."""

    layout: Layout
    memory: PeakMemory
    compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    bubble_s: float
    dp_comm_s: float
    step_s: float
    mfu: float
    links: dict[str, str] = field(default_factory=dict)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.step_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["memory"] = {
            "model_states": self.memory.model_states.total,
            "parameters": self.memory.model_states.parameters,
            "gradients": self.memory.model_states.gradients,
            "optimizer_states": self.memory.model_states.optimizer_states,
            "activations": self.memory.activations,
            "recompute_workspace": self.memory.recompute_workspace,
            "gathered_parameters": self.memory.gathered_parameters,
            "logits": self.memory.logits,
            "total": self.memory.total,
        }
        d["bubble_fraction"] = self.bubble_fraction
        d["label"] = self.layout.label()
        return d


def peak_memory(
    model: ModelSpec | str, layout: Layout, *, recipe: str = "mixed_adam"
) -> PeakMemory:
    """Peak memory per GPU of ``layout`` for ``model``, as the planner counts it:
    :func:`~distlab.calc.memory.peak_bytes` with the model's shape, its vocabulary (the last
    stage's fp32 logits) and the model's largest layer (or embedding) as FSDP's gathered
    unit."""
    spec = model_preset(model) if isinstance(model, str) else model
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"model must be a ModelSpec or a preset name, got {model!r}")
    layout = _planned(layout)
    return peak_bytes(
        n_params=spec.n_params,
        layers=spec.layers,
        hidden=spec.hidden,
        heads=spec.heads,
        seq_len=spec.seq_len,
        micro_batch=layout.micro_batch,
        micro_batches=layout.micro_batches,
        recipe=recipe,
        zero_stage=layout.zero_stage,
        dp=layout.dp,
        tp=layout.tp,
        pp=layout.pp,
        sequence_parallel=layout.sequence_parallel,
        recompute=layout.recompute,
        schedule=layout.pipeline_schedule,
        virtual_stages=layout.virtual_stages,
        largest_layer_params=spec.largest_layer_params,
        vocab=spec.vocab,
    )


def group_link(cluster: ClusterSpec, *, stride: int, size: int) -> Link | None:
    """The link of groups of ``size`` ranks ``stride`` apart, tiling the cluster's ranks
    (blocks of ``stride x size`` consecutive ranks): :func:`distlab.sim.topology.group_link`
    on those groups. The planner itself passes the groups of
    :func:`distlab.core.ranks.rank_groups`."""
    span = stride * size
    world = max(cluster.world_size, span)
    groups = [
        [start + offset + stride * i for i in range(size)]
        for start in range(0, world, span)
        for offset in range(stride)
    ]
    return topology_group_link(cluster, groups)


@dataclass
class Plan:
    """Every layout :func:`plan` tried; ``candidates`` are the ones that fit, fastest first."""

    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    assumptions: PlannerAssumptions
    candidates: list[StepEstimate]
    n_enumerated: int
    n_too_big: int

    @property
    def best(self) -> StepEstimate:
        if not self.candidates:
            raise ValueError(
                f"no layout of {self.model.name} fits on {self.cluster.world_size} GPUs of "
                f"{self.cluster.gpu_memory_bytes / GB:.0f} GB with global batch {self.global_batch}; "
                "add GPUs, shrink the batch or allow more recompute/ZeRO"
            )
        return self.candidates[0]

    def estimate_for(self, layout: Layout) -> StepEstimate | None:
        """The estimate of ``layout`` if the planner enumerated it and it fits in memory;
        ``None`` if it breaks one of the rules (module docstring; e.g. sequence parallelism
        off with tp > 1) or does not fit."""
        return self._estimates_by_layout.get(_planned(layout))

    @cached_property
    def _estimates_by_layout(self) -> dict[Layout, StepEstimate]:
        """The candidates by layout (``Layout`` is frozen, so hashable): a lookup, not a scan
        of thousands of estimates per call (a notebook-12 test asks for about 10,000)."""
        return {e.layout: e for e in reversed(self.candidates)}  # the first of equal ones

    def explain(self) -> list[str]:
        """Why the winner wins: its memory, bubble, communication and links, in sentences."""
        return _explain(self)

    def to_dict(self, top: int = 10) -> dict:
        return {
            "model": self.model.to_dict(),
            "cluster": self.cluster.to_dict(),
            "global_batch": self.global_batch,
            "assumptions": asdict(self.assumptions),
            "n_enumerated": self.n_enumerated,
            "n_feasible": len(self.candidates),
            "n_too_big": self.n_too_big,
            "candidates": [c.to_dict() for c in self.candidates[:top]],
            "explanation": self.explain() if self.candidates else [],
        }


def plan(
    model: ModelSpec | str,
    cluster: ClusterSpec,
    *,
    global_batch: int,
    assumptions: PlannerAssumptions | None = None,
) -> Plan:
    """Enumerate every layout of ``model`` on ``cluster`` for ``global_batch`` sequences.

    ``model``: a :class:`~distlab.calc.transformer.ModelSpec` or a preset name
    (``"70B"``). ``cluster``: a :class:`~distlab.sim.topology.ClusterSpec`
    (e.g. ``preset("dgx-h100", nodes=16)``). Returns a :class:`Plan` whose
    ``candidates`` (layouts that fit) are sorted by estimated step time.
    """
    spec = model_preset(model) if isinstance(model, str) else model
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"model must be a ModelSpec or a preset name, got {model!r}")
    if not isinstance(cluster, ClusterSpec):
        raise TypeError(f"cluster must be a distlab.sim.topology.ClusterSpec, got {cluster!r}")
    batch = positive_int("global_batch", global_batch)
    a = assumptions or PlannerAssumptions()
    ctx = _context(spec, cluster, a)
    n_gpus = cluster.world_size
    kv_heads = spec.kv_heads or spec.heads
    candidates, enumerated, too_big = [], 0, 0
    for tp in divisors(n_gpus):
        if spec.heads % tp or kv_heads % tp or spec.seq_len % tp:
            continue
        if a.max_tp is not None and tp > a.max_tp:
            continue
        for pp in divisors(n_gpus // tp):
            dp = n_gpus // (tp * pp)
            if spec.layers % pp or batch % dp:
                continue
            local = batch // dp
            for b in divisors(local):
                m = local // b
                for v in a.virtual_stages:
                    if v > 1 and (pp == 1 or m % pp or (spec.layers // pp) % v):
                        continue
                    for zero in a.zero_stages:
                        if (zero > 1 and pp > 1) or (zero > 0 and dp == 1):
                            continue
                        for rc in a.recompute:
                            enumerated += 1
                            layout = Layout(
                                tp=tp, pp=pp, dp=dp, zero_stage=zero, micro_batch=b,
                                micro_batches=m, recompute=rc, virtual_stages=v,
                                sequence_parallel=tp > 1,
                            )  # fmt: skip
                            est = ctx.estimate(layout)
                            if est is None:
                                too_big += 1
                            else:
                                candidates.append(est)
    # Fastest first; layouts within 0.1% of each other's time: least memory first.
    fastest = min((e.step_s for e in candidates), default=1.0)
    candidates.sort(key=lambda e: (round(e.step_s / fastest, 3), e.memory.total))
    return Plan(spec, cluster, batch, a, candidates, enumerated, too_big)


def evaluate(
    model: ModelSpec | str,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    assumptions: PlannerAssumptions | None = None,
) -> StepEstimate:
    """The estimate :func:`plan` makes for one given ``layout``, with the same formulas,
    whether or not it fits (compare ``.memory.total`` with the GPU's memory).
    ``layout.world_size`` must be the cluster's GPU count."""
    spec = model_preset(model) if isinstance(model, str) else model
    layout = _planned(layout)
    if layout.world_size != cluster.world_size:
        raise ValueError(
            f"{layout.label()} needs tp*pp*dp = {layout.tp}*{layout.pp}*{layout.dp} = "
            f"{layout.world_size} GPUs, not the cluster's {cluster.world_size}; choose degrees "
            "whose product is the GPU count"
        )
    return _context(spec, cluster, assumptions or PlannerAssumptions()).estimate(layout, fit=False)


@lru_cache(maxsize=16)
def _context(spec: ModelSpec, cluster: ClusterSpec, a: PlannerAssumptions) -> _Context:
    """One :class:`_Context` per (model, cluster, assumptions), all frozen: a search that
    calls :func:`evaluate` per layout reuses its constants and its links per group shape."""
    return _Context(spec, cluster, a)


def _planned(layout: Layout) -> Layout:
    """``layout``, if it is one the planner's formulas cover: tp, pp and dp (cp and ep are
    not estimated yet)."""
    layout = check_layout(layout)
    if layout.cp > 1 or layout.ep > 1:
        raise ValueError(
            f"the planner estimates tp, pp and dp only; {layout.label()} has cp={layout.cp}, "
            f"ep={layout.ep} (use cp=1, ep=1)"
        )
    return layout


class _Context:
    """Per-plan constants and caches, so each layout costs a few arithmetic operations."""

    def __init__(self, spec: ModelSpec, cluster: ClusterSpec, a: PlannerAssumptions) -> None:
        self.spec, self.cluster, self.a = spec, cluster, a
        self.recipe = get_recipe(a.recipe)
        self.capacity = cluster.gpu_memory_bytes * (1 - a.memory_headroom)
        self.peak = positive("gpu_peak_flops", cluster.gpu_peak_flops)
        self.flops_per_token = model_flops_per_token(
            spec.n_params, layers=spec.layers, hidden=spec.hidden, seq_len=spec.seq_len
        )
        self._links: dict[tuple[int, int, int, str], tuple[Link | None, ...]] = {}

    def links(self, c: Layout) -> tuple[Link | None, Link | None, Link | None]:
        """(tp, dp, pp) links of layout ``c``: its groups from :mod:`distlab.core.ranks`
        (:func:`~distlab.core.ranks.rank_groups`' layout in ``c.order``, as arrays), their
        links from :func:`distlab.sim.topology.group_link`; cached per (tp, dp, pp, order)."""
        key = (c.tp, c.dp, c.pp, c.order)
        if key not in self._links:
            world, degrees = self.cluster.world_size, {"tp": c.tp, "dp": c.dp, "pp": c.pp}
            self._links[key] = tuple(
                topology_group_link(self.cluster, group_array(world, d, order=c.order, **degrees))
                for d in ("tp", "dp", "pp")
            )
        return self._links[key]

    def memory(self, c: Layout) -> PeakMemory:
        """Peak memory per GPU of layout ``c`` (:func:`peak_memory`)."""
        return peak_memory(self.spec, c, recipe=self.a.recipe)

    def slot_seconds(self, c: Layout, tp_link, pp_link) -> tuple[float, float, float]:
        """(compute, TP communication, PP sends) of one micro-batch through one stage."""
        spec, s, h = self.spec, self.spec.seq_len, self.spec.hidden
        tokens = c.micro_batch * s
        overhead = recompute_overhead(c.recompute, seq_len=s, hidden=h)
        compute = (self.flops_per_token * tokens * (1 + overhead) / (c.tp * c.pp)) / (
            self.peak * self.a.compute_efficiency
        )
        tp_s = pp_s = 0.0
        if tp_link is not None:
            tp_s = tensor_parallel_comm(
                seq_len=s,
                micro_batch=c.micro_batch,
                hidden=h,
                layers=spec.layers // c.pp,
                tp=c.tp,
                sequence_parallel=c.sequence_parallel,
                recompute=c.recompute,
            ).time_on(tp_link)
        if pp_link is not None:
            pp_s = pipeline_parallel_comm(
                seq_len=s,
                micro_batch=c.micro_batch,
                hidden=h,
                micro_batches=1,
                pp=c.pp,
                tp=c.tp,
                virtual_stages=c.virtual_stages,
            ).time_on(pp_link)
        return compute, tp_s, pp_s

    def dp_seconds(self, c: Layout, dp_link) -> float:
        """Exposed data-parallel communication per step (the ``dp_overlap`` share is hidden)."""
        if dp_link is None:
            return 0.0
        volume = data_parallel_comm(
            self.spec.n_params / (c.tp * c.pp),
            dp=c.dp,
            zero_stage=c.zero_stage,
            bytes_per_param=self.recipe.param_bytes,
            bytes_per_grad=self.recipe.grad_bytes,
            micro_batches=c.micro_batches,
        )
        return volume.time_on(dp_link, all_reduce="auto") * (1 - self.a.dp_overlap)

    def estimate(self, c: Layout, *, fit: bool = True) -> StepEstimate | None:
        """Step time of layout ``c``: ``(m + bubble slots)`` micro-batch slots plus the exposed
        data-parallel communication; ``None`` when it does not fit in memory (unless ``fit=False``)."""
        mem = self.memory(c)
        if fit and mem.total > self.capacity:
            return None
        tp_link, dp_link, pp_link = self.links(c)
        compute, tp_s, pp_s = self.slot_seconds(c, tp_link, pp_link)
        slot, m = compute + tp_s + pp_s, c.micro_batches
        bubble = bubble_fraction(
            c.pp, m, schedule=c.pipeline_schedule, virtual_stages=c.virtual_stages,
            relative_to="ideal",
        )  # fmt: skip
        bubble_slots = bubble * m  # (pp - 1) / v idle slots per step
        dp_s = self.dp_seconds(c, dp_link)
        step = (m + bubble_slots) * slot + dp_s
        tokens = c.micro_batch * self.spec.seq_len
        model_flops = self.flops_per_token * tokens * m * c.dp
        links = {
            name: (link.name if link is not None else "-")
            for name, link in (("tp", tp_link), ("pp", pp_link), ("dp", dp_link))
        }
        return StepEstimate(
            c,
            mem,
            compute_s=m * compute,
            tp_comm_s=m * tp_s,
            pp_comm_s=m * pp_s,
            bubble_s=bubble_slots * slot,
            dp_comm_s=dp_s,
            step_s=step,
            mfu=model_flops / (step * self.cluster.world_size * self.peak),
            links=links,
        )


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _ms(x: float) -> str:
    return format_seconds(x)


def _explain(p: Plan) -> list[str]:
    best, cl = p.best, p.cluster
    header = (
        f"{p.model.name} ({p.model.n_params / 1e9:.1f}B parameters) on {cl.world_size} GPUs "
        f"({cl.nodes} x {cl.gpus_per_node}, {cl.name}), global batch {p.global_batch} x "
        f"{p.model.seq_len} tokens: {p.n_enumerated} layouts tried, {len(p.candidates)} fit."
    )
    links = (
        f"Links: TP over {best.links['tp']}, PP over {best.links['pp']}, "
        f"DP over {best.links['dp']}."
    )
    return [
        header,
        f"Winner: {best.layout.label()}.",
        _memory_line(p),
        _time_line(p),
        links,
        _why_tp_inside(p),
    ]


def _memory_line(p: Plan) -> str:
    mem, states = p.best.memory, p.best.memory.model_states
    extras = ""
    if mem.recompute_workspace:
        extras += f", recompute workspace {_gb(mem.recompute_workspace)}"
    if mem.gathered_parameters:
        extras += f", gathered layer {_gb(mem.gathered_parameters)}"
    return (
        f"Memory per GPU: {_gb(mem.total)} of {_gb(p.cluster.gpu_memory_bytes)} "
        f"({p.assumptions.memory_headroom:.0%} kept free): model states {_gb(states.total)} "
        f"(parameters {_gb(states.parameters)}, gradients {_gb(states.gradients)}, optimizer "
        f"{_gb(states.optimizer_states)}), activations {_gb(mem.activations)} for "
        f"{mem.in_flight_micro_batches:g} micro-batch(es) x {mem.layers_per_stage} layers{extras}."
    )


def _time_line(p: Plan) -> str:
    best = p.best
    return (
        f"Step {_ms(best.step_s)}: compute {_ms(best.compute_s)}, TP communication "
        f"{_ms(best.tp_comm_s)}, pipeline sends {_ms(best.pp_comm_s)}, bubble "
        f"{_ms(best.bubble_s)} ({best.bubble_fraction:.1%} of the step), exposed DP/ZeRO "
        f"communication {_ms(best.dp_comm_s)}; MFU {best.mfu:.1%} at an assumed "
        f"{p.assumptions.compute_efficiency:.0%} of peak for the matmuls."
    )


def _why_tp_inside(p: Plan) -> str:
    best, c, cl = p.best, p.best.layout, p.cluster
    if c.tp == 1:
        return (
            "TP = 1: the model fits without splitting layers, so no per-layer all-reduces are paid."
        )
    spec = p.model
    comm = tensor_parallel_comm(
        seq_len=spec.seq_len,
        micro_batch=c.micro_batch,
        hidden=spec.hidden,
        layers=spec.layers // c.pp,
        tp=c.tp,
        micro_batches=c.micro_batches,
        sequence_parallel=c.sequence_parallel,
        recompute=c.recompute,
    )
    network = network_link(cl)
    on_network = comm.time_on(network)
    text = (
        f"Why TP stays inside the NVLink domain: each GPU sends {_gb(comm.total)} of TP traffic per "
        f"step in {comm.messages:.0f} messages; that takes {_ms(best.tp_comm_s)} over "
        f"{best.links['tp']} but would take {_ms(on_network)} over {network.name}, "
        f"{on_network / max(best.tp_comm_s, 1e-12):.0f}x longer, on the critical path of every "
        "micro-batch."
    )
    across = [e for e in p.candidates if e.layout.tp > cl.nvlink_domain_gpus]
    if across:
        text += (
            f" The fastest layout with TP across domains ({across[0].layout.label()}) takes "
            f"{_ms(across[0].step_s)} per step, {across[0].step_s / best.step_s:.2f}x the winner."
        )
    return text
