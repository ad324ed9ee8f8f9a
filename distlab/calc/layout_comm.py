"""What one rank of a composed run sends per step, by process group, for any :class:`Layout`.

The mirror of :func:`distlab.parallel.compose.train` without torch: one formula per
parallelism, each from :mod:`distlab.calc.comm`, :mod:`distlab.calc.moe` or
:mod:`distlab.calc.buckets`, composed for whatever degrees the layout sets.
:func:`layout_comm` returns, for one rank, a :class:`~distlab.calc.volume.CommVolume`
per group name, named as :func:`distlab.parallel.comm.trace.trace_comm` names the
group (the first name of :data:`distlab.core.ranks.GROUP_NAMES` whose rank list it
has: with dp = 1 the dp-cp reduction is ``"cp"``, with cp = 1 it is ``"dp"``), so
``.total`` of each equals the wire bytes ``ComposedRun.bytes_by_group`` records
for that group in one step.

Per step, with m micro-batches of b sequences, s_c = s / cp tokens of each on a rank
(s_c / tp between layers with sequence parallelism), v chunks per rank, the rank's
layers split into dense and MoE ones (:func:`rank_modules`):

* **tensor** (``"tp"``): :func:`~distlab.calc.comm.tensor_parallel_comm` for the dense
  layers (two all-reduces of b s_c h forward, two backward; with SP each an all-gather
  and a reduce-scatter) plus, with SP, the two re-gathers distlab's column layers make in
  backward (:class:`~distlab.parallel.tensor.sequence.LinearsOnGatheredSequence`,
  Megatron-LM's memory-saving column layer), and the one all-reduce over tp of the
  sequence-parallel gradients (LayerNorms, row-parallel biases, positions) per step;
  a MoE layer's attention only (its experts are whole on every TP rank: half a
  dense layer's count); :func:`~distlab.calc.comm.vocab_parallel_comm` for the
  embedding, head and loss (with SP: embedding reduce-scatter forward and all-gather
  backward, head all-gather forward, re-gather and reduce-scatter backward);
* **context** (``"cp"``): :func:`~distlab.calc.comm.context_parallel_comm`'s forward K/V
  blocks and backward K/V gradients, ``2 b s_c h/tp`` elements per message (the ring
  runs on the rank's h/tp head features), ``cp - 1`` of each per layer and micro-batch.
  Its third part, the K/V blocks passed round again in backward, is left out:
  distlab's ring (:func:`~distlab.parallel.context.ring.ring_attention`) keeps every block
  for backward instead of recomputing. ``context="all_gather"`` (Llama 3's K/V all-gather)
  is :func:`~distlab.calc.comm.context_parallel_gather_comm`, ``"ulysses"``
  :func:`~distlab.calc.comm.ulysses_comm`, on the same s_c and h/tp;
* **expert** (``"ep"``): :func:`~distlab.calc.moe.moe_all_to_all_comm`, 4 all-to-alls per
  MoE layer and micro-batch of the ``E x C x h`` buffer, C from the b s_c tokens a rank routes;
* **pipeline** (``"pp"``): :func:`~distlab.calc.comm.pipeline_parallel_comm`'s sends, m (v -
  [last stage]) activations and m (v - [first stage]) gradients (Narayanan et al. 2021,
  Section 2.2.2), each the whole tensor a rank holds, plus the executor's 64-byte shape
  header before each (:data:`PIPELINE_HEADER_BYTES`);
* **tied embedding** (``"embedding"``): with pp > 1 the first and last stages send each
  other their ``ceil(V/tp) x h`` part of the embedding's gradient once per step;
* **data** (the dp-cp group): ``zero_stage=0`` one all-reduce of the dense gradients as
  one flat buffer (:func:`flat_all_reduce`) and one of the expert gradients over
  ``"expert_dp"`` (:func:`~distlab.parallel.moe.layer.average_moe_gradients`); ZeRO-1 a reduce-scatter and an
  all-gather per flat group (:func:`zero_flat_group_parts`); ZeRO-2 the reduce-scatter
  after every backward pass (m v per step) and one all-gather; FSDP
  (:func:`fsdp_unit_parts`) two all-gathers and a reduce-scatter per unit (one per
  module owning parameters) and per micro-batch: :func:`~distlab.calc.comm.data_parallel_comm`
  for each (with full recomputation, a third all-gather of a block's units:
  :func:`fsdp_regathered_parts`).

**Recomputation** sends the forward's messages again, in backward: ``recompute="full"``
re-runs each block's forward (its context-parallel K/V messages and its MoE all-to-alls:
every ``forward`` part of those counted twice; its tensor-parallel collectives but the
block's closing one, :func:`recomputed_tensor_parts`), and
``"selective"`` with cp > 1 re-runs the attention core, whose K/V messages are the
context-parallel forward ones (:func:`recomputed`).

**Mixed precision** (``precision="bf16"`` or ``"fp16"``, :func:`distlab.parallel.compose.train`'s)
changes what some messages weigh, not how many there are: under ``torch.autocast`` the
parameters stay fp32 and each matmul casts its inputs to 16 bits, so a message is 16-bit
exactly when it carries a matmul's output or that output's gradient (:data:`AUTOCAST_16_BIT`);
under FSDP's policy the parameters themselves are gathered in 16 bits, so every
activation is 16-bit and only the gradient reductions and the loss stay fp32
(:data:`FSDP_FP32`). :func:`message_widths` applies the two tables.

Not per step, so not here: ZeRO's and FSDP's broadcast of the parameters when they are
built, the loss average the loop reports, checks made when the model is built.
Counted as ring collectives move bytes (:mod:`distlab.calc.volume`): exact per rank when
every group has 2 ranks, and for larger groups when the group size divides each buffer.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, replace

from distlab.core.checks import positive, positive_int
from distlab.core.layout import Layout
from distlab.core.pipeline_schedule import V_SHAPED
from distlab.core.ranks import GROUP_NAMES
from distlab.core.units import dtype_bytes

from .buckets import zero_flat_groups
from .comm import (
    CP_METHODS,
    context_parallel_comm,
    context_parallel_gather_comm,
    data_parallel_comm,
    pipeline_parallel_comm,
    tensor_parallel_comm,
    ulysses_comm,
    vocab_parallel_comm,
)
from .memory import ModelStateBytes, model_state_bytes
from .moe import moe_all_to_all_comm
from .transformer import ModelSpec, rank_parameter_tensors
from .volume import CommPart, CommVolume

#: bytes of the shape header distlab's pipeline executor sends before every tensor
#: (8 int64: ndim, dtype, up to 6 sizes; ``distlab.parallel.pipeline.executor._HEADER``)
PIPELINE_HEADER_BYTES = 64
#: schedules that split the backward into input- and weight-gradient passes: FSDP's and
#: ZeRO-2's per-backward collectives run on another count there (not modelled)
SPLIT_BACKWARD = ("zb_h1", "zb_h2", *V_SHAPED)
#: ``precision``: what :func:`distlab.parallel.compose.train` computes in (its ``PRECISIONS``)
PRECISIONS = ("fp32", "bf16", "fp16")
#: Under ``torch.autocast`` with fp32 parameters, the messages (by group kind, then part) that
#: carry a 16-bit tensor, and why; every other message carries an fp32 one: the residual
#: stream between stages (an fp32 input plus a 16-bit output is fp32), the embedding
#: lookup (not a matmul), the LayerNorm outputs a column layer gathers (autocast runs
#: layer_norm in fp32, and the cast to 16 bits sits inside the linear, so its gradient is
#: cast back to fp32 before the all-reduce behind it), the loss (computed in fp32) and
#: every gradient reduction (the gradients of fp32 parameters are fp32). ``"*"``: all.
AUTOCAST_16_BIT = {
    "tp": {
        "forward all-reduce": "the row-parallel linear's output",
        "forward all-reduce (MoE layers' attention)": "the row-parallel linear's output",
        "forward all-reduce recomputed (attention's)": "the row-parallel linear's output",
        "forward reduce-scatter (SP)": "the row-parallel linear's output",
        "forward reduce-scatter recomputed (SP, attention's)": "the row-parallel linear's output",
        "backward all-gather (SP)": "the gradient of that 16-bit output",
        "backward reduce-scatter (SP)": "dX of distlab's column layer, whose own backward "
        "runs its matmuls under the step's autocast (LinearsOnGatheredSequence)",
        "head input-gradient reduce-scatter (SP)": "dX of the head, the same column layer",
    },
    "cp": {"*": "q, k and v are linear outputs, and attention's output is 16-bit too"},
    "ep": {"*": "the expert buffers are einsums of the tokens (autocast runs einsum in 16 "
           "bits), and the experts' outputs are linear outputs"},
}  # fmt: skip
#: Under FSDP's ``MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)`` every
#: parameter is gathered in 16 bits, so every activation and its gradient is 16-bit;
#: the messages that stay fp32, and why.
FSDP_FP32 = {
    "tp": {
        "loss log-sum-exp all-gather (fp32)": "the vocab-parallel loss runs in fp32",
        "loss target-logit all-reduce (fp32)": "the vocab-parallel loss runs in fp32",
    },
    "data": {"gradient reduce-scatter": "reduce_dtype=fp32: gradients are reduced in fp32"},
    "embedding": {"*": "a gradient, in fp32 after FSDP's reduction"},
}


@dataclass(frozen=True)
class MoESpec:
    """The MoE layers of a :class:`distlab.parallel.moe.gpt.MoEGPT` (its ``MoEConfig``'s fields):
    block i has a MoE MLP when ``(i + 1) % every == 0``; experts of ``ffn_hidden`` (4h if None)."""

    num_experts: int
    top_k: int = 1
    capacity_factor: float = 1.25
    every: int = 2
    ffn_hidden: int | None = None

    def __post_init__(self) -> None:
        positive_int("num_experts", self.num_experts)
        positive_int("top_k", self.top_k)
        positive("capacity_factor", self.capacity_factor)
        positive_int("every", self.every)

    def is_moe_layer(self, index: int) -> bool:
        return (index + 1) % self.every == 0


@dataclass(frozen=True)
class RankModule:
    """One module of a rank's share that owns parameters: their element counts, in order;
    ``expert``: an expert's (reduced over ``"expert_dp"``, not dp-cp)."""

    name: str
    tensors: tuple[int, ...]
    expert: bool = False


def stage_layers(layout: Layout, stage: int, layers: int) -> list[int]:
    """The block indices pipeline rank ``stage`` holds: chunk c is virtual stage c p + stage
    (Narayanan et al. 2021, Section 2.2.2), L / (p v) blocks each, chunk 0 first."""
    p, v = layout.pp, layout.virtual_stages
    per_chunk, rest = divmod(layers, p * v)
    if rest:
        raise ValueError(f"layers={layers} is not divisible by pp * virtual_stages = {p * v}")
    out = []
    for chunk in range(v):
        j = chunk * p + stage
        out += range(j * per_chunk, (j + 1) * per_chunk)
    return out


def _layer_modules(spec: ModelSpec, tp: int) -> list[tuple[str, tuple[int, ...]]]:
    """One tensor-parallel layer's modules owning parameters, in order (norm, q, k, v, proj,
    norm, fc1 (gate and up when gated), fc2), each its (weight[, bias]) or norm tensors,
    cut from :func:`~distlab.calc.transformer.rank_parameter_tensors`."""
    one_layer = replace(spec, layers=1, tied_embeddings=True)
    tensors = rank_parameter_tensors(one_layer, tp=tp)
    norm = 2 if spec.norm == "layernorm" else 1
    linear = 2 if spec.biases else 1
    layer = tensors[1 + int(spec.learned_positions) : len(tensors) - norm]
    fc1 = ["mlp.gate", "mlp.up"] if spec.gated_mlp else ["mlp.fc1"]
    names = ["ln1", "attn.q", "attn.k", "attn.v", "attn.proj", "ln2", *fc1, "mlp.fc2"]
    modules, at = [], 0
    for name in names:
        n = norm if name.startswith("ln") else linear
        modules.append((name, tuple(layer[at : at + n])))
        at += n
    return modules


def rank_modules(
    spec: ModelSpec, layout: Layout, stage: int, moe: MoESpec | None = None
) -> list[RankModule]:
    """The modules owning parameters on pipeline rank ``stage`` of ``layout``, in the order
    of its chunks' ``parameters()`` (what ZeRO buckets and FSDP wraps).

    Tensor parallelism as :func:`~distlab.calc.transformer.rank_parameter_tensors`
    (Megatron's splits, ``ceil(V/tp)`` vocabulary rows); a MoE block keeps TP attention,
    a replicated router (``E x h``, no bias) and ``E / ep`` whole experts
    (``h f + f`` and ``f h + h``). The head is the last virtual stage's own tensor
    unless it is the tied embedding on the same rank (pp = 1)."""
    h, t, p, v = spec.hidden, layout.tp, layout.pp, layout.virtual_stages
    embedding = -(-spec.vocab // t) * h
    layer = _layer_modules(spec, t)
    modules: list[RankModule] = []
    per_chunk = spec.layers // (p * v)
    for chunk in range(v):
        j = chunk * p + stage
        if j == 0:
            modules.append(RankModule("tok", (embedding,)))
            if spec.learned_positions:
                modules.append(RankModule("pos", (spec.seq_len * h,)))
        for i in range(j * per_chunk, (j + 1) * per_chunk):
            if moe is None or not moe.is_moe_layer(i):
                modules += [RankModule(f"blocks.{i}.{n}", ts) for n, ts in layer]
                continue
            if moe.num_experts % layout.ep:
                raise ValueError(
                    f"num_experts={moe.num_experts} is not divisible by ep={layout.ep}"
                )
            f = moe.ffn_hidden or 4 * h
            attention = [(n, ts) for n, ts in layer if not n.startswith("mlp.")]
            modules += [RankModule(f"blocks.{i}.{n}", ts) for n, ts in attention]
            modules.append(RankModule(f"blocks.{i}.mlp.router", (moe.num_experts * h,)))
            for e in range(moe.num_experts // layout.ep):
                name = f"blocks.{i}.mlp.experts.{e}"
                modules.append(RankModule(f"{name}.fc1", (f * h, f), expert=True))
                modules.append(RankModule(f"{name}.fc2", (h * f, h), expert=True))
        if j == p * v - 1:
            if not spec.tied_embeddings or p > 1:
                modules.append(RankModule("head", (embedding,)))
            modules.append(RankModule("ln_f", (h,) * (2 if spec.norm == "layernorm" else 1)))
    return modules


def trace_name(layout: Layout, group: str, rank: int) -> str:
    """The name a trace gives ``rank``'s ``group``: the first of :data:`GROUP_NAMES`
    with the same rank list (:func:`distlab.parallel.comm.trace.name_groups`)."""
    ranks = layout.group_of(group, rank)
    return next(n for n in GROUP_NAMES if layout.group_of(n, rank) == ranks)


# -- one formula per parallelism ----------------------------------------------------


def tensor_parts(spec: ModelSpec, layout: Layout, stage: int, *, micro_batch: int,
                 moe: MoESpec | None = None, bytes_per_element: int = 4) -> tuple:  # fmt: skip
    """The ``"tp"`` group's collectives (module docstring, first item)."""
    t, m, sp = layout.tp, layout.micro_batches, layout.sequence_parallel
    if t == 1:
        return ()
    layers = stage_layers(layout, stage, spec.layers)
    n_moe = sum(1 for i in layers if moe is not None and moe.is_moe_layer(i))
    first, last = stage == 0, stage == layout.pp - 1
    shape = {"seq_len": spec.seq_len // layout.cp, "micro_batch": micro_batch,
             "hidden": spec.hidden, "bytes_per_element": bytes_per_element}  # fmt: skip
    activation = shape["seq_len"] * micro_batch * spec.hidden * bytes_per_element
    parts = tensor_parallel_comm(**shape, layers=len(layers) - n_moe, tp=t, micro_batches=m,
                                 sequence_parallel=sp).parts  # fmt: skip
    if layout.recompute == "full":
        parts += recomputed_tensor_parts(layout, len(layers), activation)
    if n_moe:  # attention only: one collective forward and one backward per MoE layer
        halves = tensor_parallel_comm(**shape, layers=n_moe, tp=t, micro_batches=m).parts
        parts += tuple(replace(p, what=f"{p.what} (MoE layers' attention)", count=p.count // 2)
                       for p in halves)  # fmt: skip
    vocab = vocab_parallel_comm(**shape, tp=t, micro_batches=m, first_stage=first,
                                last_stage=last).parts  # fmt: skip
    if not sp:
        return parts + vocab
    dense = len(layers) - n_moe
    parts += (CommPart("backward re-gather of column layers' input (SP)", "all_gather", t,
                       activation, 2 * dense * m),)  # fmt: skip
    if first:
        parts += (CommPart("embedding output reduce-scatter (SP)", "reduce_scatter", t, activation, m),
                  CommPart("embedding gradient all-gather (SP)", "all_gather", t, activation, m))  # fmt: skip
    if last:
        parts += (CommPart("head input all-gather, forward and backward (SP)", "all_gather", t,
                           activation, 2 * m),
                  CommPart("head input-gradient reduce-scatter (SP)", "reduce_scatter", t,
                           activation, m))  # fmt: skip
        parts += tuple(p for p in vocab if p.what.startswith("loss"))
    h = spec.hidden
    norm = 2 if spec.norm == "layernorm" else 1  # norms and row-parallel biases per layer:
    per_layer = 2 * norm * h + (2 * h if spec.biases else 0)
    positions = spec.seq_len * h if first and spec.learned_positions else 0
    marked = len(layers) * per_layer + positions + (norm * h if last else 0)
    parts += (CommPart("sequence-parallel gradients all-reduce (flat)", "all_reduce", t,
                       marked * bytes_per_element),)  # fmt: skip
    return parts


def context_parts(spec: ModelSpec, layout: Layout, stage: int, *, micro_batch: int,
                  bytes_per_element: int = 4, context: str = "ring") -> tuple:  # fmt: skip
    """Context parallelism's messages per step (module docstring, second item), on the
    rank's s / cp tokens and h / tp head features, for each ``context`` method of
    :data:`~distlab.calc.comm.CP_METHODS`: ``"ring"`` :func:`~distlab.calc.comm.context_parallel_comm`
    less its second backward pass (distlab's ring keeps the K/V blocks),
    ``"all_gather"`` :func:`~distlab.calc.comm.context_parallel_gather_comm`,
    ``"ulysses"`` :func:`~distlab.calc.comm.ulysses_comm`."""
    if context not in CP_METHODS:
        raise ValueError(f"context must be one of {CP_METHODS}, got {context!r}")
    if layout.cp == 1:
        return ()
    formula = {"ring": functools.partial(context_parallel_comm, keeps_blocks=True),
               "all_gather": context_parallel_gather_comm, "ulysses": ulysses_comm}[context]  # fmt: skip
    volume = formula(
        seq_len=spec.seq_len // layout.cp, micro_batch=micro_batch,
        hidden=spec.hidden // layout.tp, layers=len(stage_layers(layout, stage, spec.layers)),
        cp=layout.cp, micro_batches=layout.micro_batches, bytes_per_element=bytes_per_element,
    )  # fmt: skip
    return recomputed(volume.parts, layout.recompute in ("full", "selective"))


def expert_parts(spec: ModelSpec, layout: Layout, stage: int, *, micro_batch: int,
                 moe: MoESpec | None, bytes_per_element: int = 4) -> tuple:  # fmt: skip
    """Expert parallelism's all-to-alls (module docstring, third item)."""
    layers = stage_layers(layout, stage, spec.layers)
    n_moe = sum(1 for i in layers if moe is not None and moe.is_moe_layer(i))
    if moe is None or layout.ep == 1 or not n_moe:
        return ()
    parts = moe_all_to_all_comm(
        tokens=micro_batch * spec.seq_len // layout.cp, hidden=spec.hidden,
        num_experts=moe.num_experts, ep=layout.ep, top_k=moe.top_k,
        capacity_factor=moe.capacity_factor, moe_layers=n_moe,
        micro_batches=layout.micro_batches, bytes_per_element=bytes_per_element,
    ).parts  # fmt: skip
    return recomputed(parts, layout.recompute == "full")


def recomputed_tensor_parts(layout: Layout, layers: int, activation: float) -> tuple:
    """The tensor-parallel collectives full recomputation runs again, per step: each block's
    forward re-runs in backward up to its last saved tensor (``torch.utils.checkpoint``
    stops early), so every forward collective but the block's closing one (the MLP's
    output all-reduce, or its reduce-scatter with SP: nothing saves its output) runs
    twice. Megatron-LM's own recomputation re-runs both (:func:`~distlab.calc.comm.tensor_parallel_comm`)."""
    t, m = layout.tp, layout.micro_batches
    if layout.sequence_parallel:
        return (CommPart("forward all-gathers recomputed (SP)", "all_gather", t, activation,
                         2 * layers * m),
                CommPart("forward reduce-scatter recomputed (SP, attention's)",
                         "reduce_scatter", t, activation, layers * m))  # fmt: skip
    return (CommPart("forward all-reduce recomputed (attention's)", "all_reduce", t, activation,
                     layers * m),)  # fmt: skip


def recomputed(parts: tuple, again: bool) -> tuple:
    """``parts`` with each ``forward`` part sent once more when ``again`` (the forward is
    recomputed in backward, and its messages with it)."""
    if not again:
        return parts
    return parts + tuple(replace(p, what=f"{p.what} (recomputed)") for p in parts
                         if p.what.startswith("forward"))  # fmt: skip


def pipeline_parts(spec: ModelSpec, layout: Layout, stage: int, *, micro_batch: int,
                   bytes_per_element: int = 4, headers: bool = True) -> tuple:  # fmt: skip
    """The sends of pipeline rank ``stage`` (module docstring, fourth item)."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    if p == 1:
        return ()
    if layout.pipeline_schedule in V_SHAPED:
        raise ValueError(
            f"schedule {layout.pipeline_schedule!r}: the V's local hand-over is not modelled"
        )
    tokens = spec.seq_len // layout.cp // (layout.tp if layout.sequence_parallel else 1)
    sends = pipeline_parallel_comm(seq_len=tokens, micro_batch=micro_batch, hidden=spec.hidden,
                                   micro_batches=m, pp=p, virtual_stages=v,
                                   bytes_per_element=bytes_per_element).parts  # fmt: skip
    counts = (m * (v - int(stage == p - 1)), m * (v - int(stage == 0)))
    parts = tuple(replace(part, count=n) for part, n in zip(sends, counts, strict=True) if n)
    if headers and sum(counts):
        parts += (CommPart("shape header before each send", "send_recv", 2,
                           PIPELINE_HEADER_BYTES, sum(counts)),)  # fmt: skip
    return parts


def tied_parts(spec: ModelSpec, layout: Layout, stage: int, *, bytes_per_element: int = 4) -> tuple:
    """The tied embedding's gradient exchange between the first and last stage."""
    p = layout.pp
    if not spec.tied_embeddings or p == 1 or stage not in (0, p - 1):
        return ()
    rows = -(-spec.vocab // layout.tp)
    return (
        CommPart("tied embedding gradient", "send_recv", 2, rows * spec.hidden * bytes_per_element),
    )


def flat_all_reduce(tensors, *, group: int, bytes_per_element: int) -> tuple:
    """One :func:`~distlab.calc.comm.data_parallel_comm` all-reduce of all the gradient
    ``tensors`` (element counts) as one flat buffer, as
    :func:`~distlab.parallel.moe.layer.average_moe_gradients` sends them; none for none."""
    if not tensors:
        return ()
    size = sum(tensors)
    (grads,) = data_parallel_comm(size, dp=group, bytes_per_grad=bytes_per_element).parts
    return (replace(grads, what=f"gradient all-reduce, one {size}-element flat buffer"),)


def zero_flat_group_parts(tensors, *, group: int, zero_stage: int, backward_passes: int,
                          bytes_per_element: int) -> tuple:  # fmt: skip
    """ZeRO-1/2 (:class:`~distlab.parallel.zero.optimizer.ZeroOptimizer`): per padded flat group
    (:func:`~distlab.calc.buckets.zero_flat_groups`), :func:`~distlab.calc.comm.data_parallel_comm`
    at ``zero_stage``; ZeRO-2 reduce-scatters at the end of each of ``backward_passes``."""
    bpe, parts = bytes_per_element, ()
    flat = zero_flat_groups(tensors, dp=group, bytes_per_element=bpe)
    for size, n in sorted(Counter(flat).items()):
        volume = data_parallel_comm(size, dp=group, zero_stage=zero_stage, bytes_per_param=bpe,
                                    bytes_per_grad=bpe, micro_batches=backward_passes)  # fmt: skip
        parts += tuple(replace(p, what=f"{p.what}, {size}-element flat groups", count=p.count * n)
                       for p in volume.parts)  # fmt: skip
    return parts


def fsdp_unit_parts(modules, *, group: int, micro_batches: int, bytes_per_element: int) -> tuple:
    """FSDP with one unit per module owning parameters (``wrap="layer"``): each unit's
    elements padded to a multiple of the group, then :func:`~distlab.calc.comm.data_parallel_comm`
    at stage 3 (all-gather forward, all-gather backward, reduce-scatter, per micro-batch)."""
    bpe, parts = bytes_per_element, ()
    padded = [-(-sum(mod.tensors) // group) * group for mod in modules]
    for size, n in sorted(Counter(padded).items()):
        volume = data_parallel_comm(size, dp=group, zero_stage=3, bytes_per_param=bpe,
                                    bytes_per_grad=bpe, micro_batches=micro_batches)  # fmt: skip
        parts += tuple(replace(p, what=f"{p.what}, {size}-element units", count=p.count * n)
                       for p in volume.parts)  # fmt: skip
    return parts


def fsdp_regathered_parts(modules, *, group: int, micro_batches: int,
                          bytes_per_element: int) -> tuple:  # fmt: skip
    """Full recomputation under FSDP: re-running a block's forward in backward gathers its
    units again, once per micro-batch, all but the block's closing one (the MLP's second
    linear, ``mlp.fc2``: the recomputation stops at the last tensor backward needs, that
    linear's input, as for the tensor-parallel collectives, :func:`recomputed_tensor_parts`).
    Each is :func:`fsdp_unit_parts`' forward all-gather once more."""
    again = [mod for mod in modules
             if mod.name.startswith("blocks.") and not mod.name.endswith(".mlp.fc2")]  # fmt: skip
    parts = fsdp_unit_parts(again, group=group, micro_batches=micro_batches,
                            bytes_per_element=bytes_per_element)  # fmt: skip
    return tuple(replace(p, what=p.what.replace("forward", "recomputed forward"))
                 for p in parts if p.what.startswith("parameter all-gather, forward"))  # fmt: skip


def data_parts(modules, layout: Layout, *, bytes_per_element: int = 4) -> tuple[tuple, tuple]:
    """``(dp-cp parts, expert_dp parts)``: the data-parallel reductions of ``modules``
    (module docstring, last item)."""
    group = layout.dp * layout.cp
    expert_group = group // layout.ep
    dense = [t for mod in modules if not mod.expert for t in mod.tensors]
    experts = [t for mod in modules if mod.expert for t in mod.tensors]
    bpe, zero = bytes_per_element, layout.zero_stage
    if zero and layout.pipeline_schedule in SPLIT_BACKWARD and zero >= 2:
        raise ValueError(f"ZeRO-{zero} with {layout.pipeline_schedule!r} is not modelled")
    if zero and experts:
        raise ValueError("ZeRO or FSDP with expert layers is not modelled (compose refuses ep > 1)")
    if group == 1:
        return (), ()
    if zero == 0:
        expert = flat_all_reduce(experts, group=expert_group, bytes_per_element=bpe)
        dense_parts = flat_all_reduce(dense, group=group, bytes_per_element=bpe)
        return dense_parts, expert if expert_group > 1 else ()
    m, v = layout.micro_batches, layout.virtual_stages
    if zero == 3:
        parts = fsdp_unit_parts(modules, group=group, micro_batches=m, bytes_per_element=bpe)
        if layout.recompute == "full":
            parts += fsdp_regathered_parts(modules, group=group, micro_batches=m,
                                           bytes_per_element=bpe)  # fmt: skip
        return parts, ()
    parts = zero_flat_group_parts(dense, group=group, zero_stage=zero, backward_passes=m * v,
                                  bytes_per_element=bpe)  # fmt: skip
    return parts, ()


# -- composed -----------------------------------------------------------------------


def message_widths(kind: str, parts: tuple, *, precision: str, fsdp: bool,
                   bytes_per_element: int = 4) -> tuple:  # fmt: skip
    """``parts`` (counted with ``bytes_per_element`` per element, fp32's) of the group kind
    ``kind`` (``"tp"``, ``"cp"``, ``"ep"``, ``"pp"``, ``"embedding"``, ``"data"``), with
    each 16-bit message's payload scaled to ``precision``'s width (module docstring):
    :data:`AUTOCAST_16_BIT` lists the 16-bit ones, or with ``fsdp``
    :data:`FSDP_FP32` the fp32 ones. The pipeline's shape headers are int64 either way."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return parts
    scale = dtype_bytes(precision) / bytes_per_element

    def is_16_bit(what: str) -> bool:
        what = what.removesuffix(" (recomputed)")
        if what.startswith("shape header"):
            return False
        if fsdp:
            fp32 = FSDP_FP32.get(kind, {})
            return not ("*" in fp32 or what in fp32 or what.split(",")[0] in fp32)
        sixteen = AUTOCAST_16_BIT.get(kind, {})
        return "*" in sixteen or what in sixteen

    return tuple(
        replace(p, payload_bytes=p.payload_bytes * scale) if is_16_bit(p.what) else p for p in parts
    )


def layout_comm(
    spec: ModelSpec,
    layout: Layout,
    rank: int,
    *,
    micro_batch: int | None = None,
    moe: MoESpec | None = None,
    bytes_per_element: int = 4,
    headers: bool = True,
    context: str = "ring",
    precision: str = "fp32",
) -> dict[str, CommVolume]:
    """Bytes ``rank`` of ``layout`` sends in one step of :func:`distlab.parallel.compose.train`,
    by the trace's group name (module docstring); groups it sends nothing in are left out.

    ``spec``: the model (:func:`distlab.calc.three_d.gpt_spec`); ``micro_batch``: sequences
    per micro-batch (default ``layout.micro_batch``; compose's is b / (dp m)); ``moe``:
    the MoE layers, if any; ``headers``: count the pipeline's shape headers; ``context``:
    how the cp ranks attend (``compose.train``'s ``context``: ring, all_gather, ulysses);
    ``precision``: what the step computes in (``compose.train``'s, :data:`PRECISIONS`): with
    "bf16" or "fp16" the 16-bit messages weigh 2 bytes an element (:func:`message_widths`)."""
    b = positive_int("micro_batch", layout.micro_batch if micro_batch is None else micro_batch)
    stage = layout.coordinates(rank)["pp"]
    bpe = positive_int("bytes_per_element", bytes_per_element)
    if layout.zero_stage == 3 and layout.pipeline_schedule in SPLIT_BACKWARD:
        raise ValueError(f"FSDP with {layout.pipeline_schedule!r} is not modelled")
    modules = rank_modules(spec, layout, stage, moe)
    dense_data, expert_data = data_parts(modules, layout, bytes_per_element=bpe)
    kw = {"micro_batch": b, "bytes_per_element": bpe}
    pieces = [
        ("tp", tensor_parts(spec, layout, stage, moe=moe, **kw)),
        ("cp", context_parts(spec, layout, stage, context=context, **kw)),
        ("ep", expert_parts(spec, layout, stage, moe=moe, **kw)),
        ("pp", pipeline_parts(spec, layout, stage, headers=headers, **kw)),
        ("embedding", tied_parts(spec, layout, stage, bytes_per_element=bpe)),
        ("dp-cp", dense_data),
        ("expert_dp", expert_data),
    ]
    by_group: dict[str, tuple] = {}
    for group, parts in pieces:
        kind = "data" if group in ("dp-cp", "expert_dp") else group
        parts = message_widths(kind, tuple(parts), precision=precision, fsdp=layout.fsdp,
                               bytes_per_element=bpe)  # fmt: skip
        name = group if group in ("ep", "pp", "embedding") else trace_name(layout, group, rank)
        if parts:
            by_group[name] = by_group.get(name, ()) + parts
    return {name: CommVolume(name, parts) for name, parts in by_group.items()}


def layout_model_state(
    spec: ModelSpec, layout: Layout, rank: int, *, moe: MoESpec | None = None,
    recipe: str = "sgd_momentum",
) -> ModelStateBytes:  # fmt: skip
    """Parameter, gradient and optimizer-state bytes of ``rank``: the ZeRO paper's stages
    (:func:`~distlab.calc.memory.model_state_bytes`) over the dp-cp group, applied to
    the rank's own tensors (:func:`rank_modules`: exact stage sizes, not Ψ / (tp pp)).
    FSDP shards each unit padded to a multiple of the group, as it runs."""
    modules = rank_modules(spec, layout, layout.coordinates(rank)["pp"], moe)
    group = layout.dp * layout.cp
    if layout.fsdp:
        n = sum(-(-sum(mod.tensors) // group) * group for mod in modules)
    else:
        n = sum(t for mod in modules for t in mod.tensors)
    return model_state_bytes(n, recipe=recipe, zero_stage=layout.zero_stage, dp=group)
