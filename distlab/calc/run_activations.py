"""What one rank of a composed run keeps for backward, term by term (the bytes its peak is
checked against).

:func:`distlab.calc.memory.activation_bytes_per_layer` is Korthikanti et al.'s count of one
transformer layer. A run keeps more, and the pipeline decides how many micro-batches'
worth at once. For one rank of a :class:`~distlab.core.layout.Layout` running
:func:`distlab.parallel.compose.train` on a GPT (dense, or a MoEGPT with ``moe=``), per
micro-batch of b sequences of s tokens, per model chunk the rank runs. Element sizes: e
bytes per activation a matmul makes (4 in fp32; 2 under ``precision="bf16"`` or
``"fp16"``, whose counts are the same), and r bytes per element of the residual stream and
the LayerNorms on it: 4, but e under FSDP with 16 bits, whose policy gathers 16-bit
parameters, so the embedding and every norm are 16-bit too. Under autocast without FSDP
the parameters stay fp32, so the embedding's output is fp32, and adding a 16-bit branch to
it (or an fp32 bias to a 16-bit matmul) gives fp32: the stream stays fp32 (r = 4, e = 2).
The 16-bit terms are CPU autocast's, what the gloo runs they are checked against do: it
runs softmax in 16 bits; CUDA's autocast runs softmax in fp32 (PyTorch's autocast op
reference), which would keep an fp32 probability matrix and a 16-bit copy of it for the
matmul after it, not counted here.

* **layers**: Korthikanti et al. 2022, Table 2, for the chunk's layers:
  ``activation_bytes_per_layer(..., dropout=p > 0, bytes_per_element=e)``, one term, so
  the paper's table reads the same here as in notebook 07; for a MoE layer without the
  MLP's share of the table (its input e b s h, GeLU input and output 8 e b s h/t and,
  with dropout, its 1-byte mask b s h: Section 4.1), which the MoE terms replace;
* **layer-norm statistics**: every LayerNorm keeps a mean and a 1/std per token, in the
  stream's dtype, for its backward (2 r bytes a token; two norms a layer): not in the
  paper's count (:mod:`distlab.parallel.tensor.activations` measures them apart); over t
  with sequence parallelism; none under full recomputation (the norm is recomputed);
* **autocast's fp32 stream and casts** (16 bits without FSDP), per layer beyond the table's
  16-bit count: each LayerNorm keeps its input in fp32, 2 (r - e) b s h (over t with
  sequence parallelism); without sequence parallelism q, k and v each cast the fp32 norm
  output to 16 bits for their matmul and keep their own copy, 2 e b s h more than the
  table's one shared input; with it, distlab's column layers
  (:class:`~distlab.parallel.tensor.sequence.LinearsOnGatheredSequence`, q k v and fc1)
  keep the fp32 shard they gather, 2 (r - e) b s h/t more; under full recomputation the
  block's input is fp32, (r - e) b s h (over t with SP);
* **autocast's 16-bit weight copies** (16 bits without FSDP), *once per chunk*: autocast
  casts each fp32 weight once per autocast region (the step) and caches the copy, which
  every micro-batch's matmul saves; the executor counts a storage once however many held
  forwards saved it, so this term is held while any micro-batch of the chunk is in flight
  (:func:`in_flight_peak`): e bytes per element of each weight a ``F.linear`` saves,
  q k v (3 h^2/t) and fc1 (f h/t) unless sequence parallelism's column layer runs them
  (its matmuls run without autograd: the fp32 weight is saved), proj (h^2/t) and fc2
  (f h/t); a MoE layer's attention (4 h^2/t) and its E/ep experts (2 f h each); the
  output layer (ceil(V/t) h) unless sequence parallelism's column layer runs it; none
  inside a fully recomputed block (the checkpoint keeps only its input). FSDP's 16-bit
  weights are gathered parameters, model state, not activations; biases are added, not
  saved;
* **embedding** (the chunk holding the first part): the token ids the lookup keeps
  (int64, b s), the position ids (int64, s) and the vocabulary-parallel embedding's
  mask of the tokens this rank's rows hold, multiplied into its output (b s elements of
  r bytes);
* **final norm and head** (the chunk holding the last part): the final LayerNorm's
  input (r b s h) and statistics and the output layer's input, a 16-bit copy (e b s h),
  or with sequence parallelism the norm's output shard the column layer keeps (r b s h/t;
  the norm's terms over t too), and the **logits and loss**: the vocabulary-parallel
  cross-entropy keeps the rank's logits in fp32 whatever the matmuls ran in
  (b s ceil(V/t) x 4 bytes), the log-sum-exp per token (fp32), the targets shifted to its
  rows (int64) and which of them are its own (1 byte);
* **MoE layers** (``moe``, a :class:`~distlab.calc.layout_comm.MoESpec`), on the T = b s
  tokens a rank routes (:mod:`distlab.parallel.moe.layer`), C = :func:`~distlab.calc.moe.expert_capacity`
  slots per expert, E experts of f hidden features, top-k routing:
  *routing*: the router's input, in fp32 (Switch Transformer's selective precision:
  ``MoE.router_logits``; 4 T h), its probabilities (fp32, 4 T E), the top-k indices
  (int64, 8 T k), with k > 1 the gates and their sum that normalise them (fp32,
  4 T (k + 1)), the mask of the kept assignments that picks their gates (1 byte, T k)
  and the balancing loss's per-expert fractions (fp32, 4 E), and under FSDP in 16 bits the
  fp32 copy of the gathered 16-bit router weight each forward makes (4 E h); *buffers*: the dispatch
  matrix (e T E C) the tokens are copied into slots with, every local expert's input,
  GeLU input and output on the slots of every ep rank (e E C (h + 2 f): E/ep experts of
  ep C slots), the experts' outputs and the combine matrix (e E C h + e T E C);
  *kept-token indices*: ``combine`` scatters the kept gates with three int64 indices
  (token, expert, slot) per kept assignment, 24 bytes each. How many are kept is known
  only once the router has routed: ``kept`` gives them (the run's
  ``ComposedRun.moe_kept``); without it the term is the capacity bound
  24 min(T k, E C), an upper bound;
* **context parallelism** (cp > 1): every term above on the rank's s/cp tokens, and one
  term for how its attention core differs from the dense core the layers term counts
  (local Q, K, V and s/cp x s/cp probabilities): Llama 3's K/V all-gather (Section
  3.3.2) keeps the gathered K and V (2 e b s h/t, instead of the local ones), the
  probabilities of its queries over the whole sequence (e b (a/t) (s/cp) s) and the
  boolean causal mask ((s/cp) s bytes); DeepSpeed-Ulysses keeps Q, K and V re-split by
  heads (the same bytes as the local ones), the probabilities of a/(t cp) heads over the
  whole sequence (e b (a/(t cp)) s^2) and the mask (s^2 bytes); ring
  attention (:func:`~distlab.parallel.context.ring.ring_attention`, :func:`ring_core_bytes`)
  keeps every K/V block it attended with (one per ring step: ``2 e b (s/cp) h/t`` each),
  and per (query chunk, key chunk) pair it visits, c tokens each, the probabilities
  (e b (a/t) c^2), the causal mask (c^2 bytes) and a copy of the query chunk for the
  matmul (e b c h/t; :func:`ring_query_bytes`), plus per pair
  after a chunk's first the softmax's decay factor (e b (a/t) c) and per query chunk its
  output and running sum (e b c h/t, e b (a/t) c); which pairs it visits depends on the
  split (:mod:`distlab.core.sequence_split`) and, for the contiguous one, on the rank
  (:func:`ring_pairs`);
* **in flight**: the executor adds a forward's bytes at each forward and frees them at
  its backward (B, or W when the backward is split), so the rank's peak is the largest sum
  over its schedule's actions in order (:func:`in_flight_peak`): 1F1B holds up to
  p - r micro-batches on rank r, GPipe all m; a chunk's once-per-chunk term is held while
  any of its micro-batches is.

With ``recompute="selective"`` the context-parallel core is checkpointed as the dense one
is: both keep only the core's inputs (Q, K, V), so there is no context-parallel term.
FSDP changes no count but the widths: the gathered weights a layer keeps for backward
are model state, not activations (FSDP frees their storage after the forward and gathers
them again for the backward), and the executor counts them as such.

Refused by name (:func:`_check_covered`): activations of another width than 2 or 4
bytes; a layout with ep > 1 without ``moe`` (its MoE layers cannot be counted without
their experts and capacity).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from distlab.core.layout import Layout
from distlab.core.pipeline_schedule import build
from distlab.core.sequence_split import chunk_count, chunks_of

from .layout_comm import MoESpec
from .memory import activation_bytes_per_layer
from .moe import expert_capacity
from .transformer import ModelSpec

FP32 = 4
INT64 = 8
BOOL = 1
WIDTHS = (2, 4)  # bytes per activation counted: 16-bit autocast (bf16, fp16) and fp32
KEPT_INDICES = 3 * INT64  # combine's token, expert and slot index of one kept assignment


@dataclass(frozen=True)
class ChunkActivations:
    """Bytes one micro-batch's forward through one model chunk keeps, by term (``terms``),
    and what every micro-batch's forward saves alike (``once``: autocast's weight copies,
    held once while any micro-batch of the chunk is in flight)."""

    chunk: int
    terms: dict[str, float]
    once: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """One micro-batch's bytes, without the once-per-chunk terms."""
        return sum(self.terms.values())

    @property
    def once_total(self) -> float:
        return sum(self.once.values())


@dataclass(frozen=True)
class _Widths:
    """Bytes per element (module docstring): ``e`` a matmul's activations, ``r`` the
    residual stream and its norms; ``casts``: autocast casts fp32 to 16 bits per matmul."""

    e: int
    r: int

    @property
    def casts(self) -> bool:
        return self.r != self.e


def _widths(layout: Layout, bytes_per_element: int) -> _Widths:
    fsdp_16_bit = layout.zero_stage == 3  # FSDP's policy gathers 16-bit parameters
    return _Widths(bytes_per_element, bytes_per_element if fsdp_16_bit else FP32)


def chunk_activations(
    spec: ModelSpec,
    layout: Layout,
    stage: int,
    *,
    micro_batch: int,
    dropout: float = 0.0,
    bytes_per_element: int = FP32,
    context: str = "ring",
    cp_rank: int = 0,
    split: str = "zigzag",
    moe: MoESpec | None = None,
    kept: Mapping[int, int] | None = None,
) -> list[ChunkActivations]:
    """Per model chunk of pipeline rank ``stage``, the bytes one micro-batch keeps (module
    docstring), for a GPT ``spec`` trained under ``layout`` (``context`` and ``split``: how
    the cp ranks attend and cut the sequence, as ``train``'s; ``cp_rank``: the rank's place
    in its cp group, which the ring's contiguous split depends on; ``moe``: the MoE layers
    of a MoEGPT; ``kept``: per chunk, the assignments its MoE layers kept in this
    micro-batch's forward, summed over them; without it, the capacity bound)."""
    _check_covered(layout, bytes_per_element, context, moe)
    schedule = _schedule(layout)
    parts = schedule.stages * schedule.chunks // (2 if schedule.bidirectional else 1)
    per_part = spec.layers // parts
    b, s, h = micro_batch, spec.seq_len // layout.cp, spec.hidden
    w = _widths(layout, bytes_per_element)
    t = layout.tp
    pieces = t if layout.sequence_parallel else 1  # what the sequence is cut into between layers
    full = layout.recompute == "full"
    layer = activation_bytes_per_layer(
        seq_len=s, micro_batch=b, hidden=h, heads=spec.heads, tp=t,
        sequence_parallel=layout.sequence_parallel, recompute=layout.recompute,
        dropout=dropout > 0, bytes_per_element=w.e,
    )  # fmt: skip
    mlp = _table_mlp_bytes(b, s, h, t, w.e, dropout > 0)
    out = []
    for chunk in range(schedule.chunks):
        part = schedule.model_part(schedule.virtual_stage(stage, chunk))
        layers = range(part * per_part, (part + 1) * per_part)
        n_moe = 0 if moe is None else sum(1 for i in layers if moe.is_moe_layer(i))
        moe_counted = 0 if full else n_moe  # a recomputed block keeps only its input
        norms = 0.0 if full else per_part * 2 * 2 * w.r * b * s / pieces
        terms = {
            "layers (Korthikanti et al. 2022, Table 2)": per_part * layer - moe_counted * mlp,
            "layer-norm statistics": norms,
        }
        once = {}
        if w.casts:
            terms["autocast: fp32 stream, per-linear casts"] = per_part * _autocast_layer_bytes(
                b, s, h, t, w, layout
            )
            once["autocast: 16-bit weight copies"] = _weight_copy_bytes(
                spec, layout, w.e, dense=per_part - n_moe, moe_layers=n_moe, moe=moe
            )
        if layout.cp > 1 and layout.recompute == "none":
            core = context_core_difference(spec, layout, micro_batch=b, bytes_per_element=w.e,
                                           context=context, cp_rank=cp_rank, split=split)  # fmt: skip
            terms[f"context-parallel attention ({context}) beyond the dense core"] = per_part * core
        if moe_counted:
            terms.update(
                _moe_terms(
                    moe,
                    moe_counted,
                    b * s,
                    h,
                    w.e,
                    kept,
                    chunk,
                    gathered_16_bit=layout.zero_stage == 3 and w.e < FP32,
                )
            )
        if part == 0:
            terms["embedding (ids, positions, vocabulary mask)"] = (
                INT64 * b * s + INT64 * s + w.r * b * s
            )
        if part == parts - 1:
            terms["final norm and head input"] = _head_input_bytes(b, s, h, pieces, w)
            vocab_rows = -(-spec.vocab // t)
            terms["logits and loss (fp32)"] = FP32 * b * s * vocab_rows + (FP32 + INT64 + 1) * b * s
            if w.casts and pieces == 1:
                once["autocast: 16-bit weight copies"] += w.e * vocab_rows * h
        out.append(ChunkActivations(chunk, terms, once))
    return out


def _table_mlp_bytes(b: int, s: int, h: int, t: int, e: int, dropout: bool) -> float:
    """The MLP's share of Korthikanti et al.'s count (Section 4.1: its input, GeLU's input
    and output, its dropout mask), without sequence parallelism (refused with MoE)."""
    return e * b * s * h + 8 * e * b * s * h / t + (BOOL * b * s * h if dropout else 0)


def _autocast_layer_bytes(b: int, s: int, h: int, t: int, w: _Widths, layout: Layout) -> float:
    """Per layer, what autocast keeps beyond the table's 16-bit count (module docstring)."""
    pieces = t if layout.sequence_parallel else 1
    widening = (w.r - w.e) * b * s * h / pieces  # one fp32 tensor instead of a 16-bit one
    if layout.recompute == "full":
        return widening  # the block's input
    if layout.sequence_parallel:
        return 4 * widening  # the two norms' inputs, the two column layers' shards
    return 2 * widening + 2 * w.e * b * s * h  # the norms' inputs; k's and v's own copies


def _weight_copy_bytes(
    spec: ModelSpec, layout: Layout, e: int, *, dense: int, moe_layers: int, moe: MoESpec | None
) -> float:
    """The 16-bit weight copies a chunk's layers save (module docstring), without the head."""
    if layout.recompute == "full":
        return 0.0
    h, f, t = spec.hidden, spec.ffn, layout.tp
    column = 0 if layout.sequence_parallel else 3 * h * h + f * h  # q, k, v; fc1
    dense_layer = (column + h * h + f * h) / t  # + proj, fc2
    if not moe_layers:
        return e * dense * dense_layer
    expert_f = moe.ffn_hidden or 4 * h
    moe_layer = 4 * h * h / t + moe.num_experts // layout.ep * 2 * expert_f * h
    return e * (dense * dense_layer + moe_layers * moe_layer)


def _head_input_bytes(b: int, s: int, h: int, pieces: int, w: _Widths) -> float:
    """The final norm's input and statistics and the output layer's input (module docstring)."""
    stats = 2 * w.r * b * s
    if pieces > 1:  # the column layer keeps the norm's output shard
        return (2 * w.r * b * s * h + stats) / pieces
    return w.r * b * s * h + w.e * b * s * h + stats


def _moe_terms(
    moe: MoESpec, layers: int, tokens: int, h: int, e: int, kept: Mapping[int, int] | None,
    chunk: int, gathered_16_bit: bool = False,
) -> dict[str, float]:  # fmt: skip
    """The MoE terms of ``layers`` MoE layers routing ``tokens`` each (module docstring);
    ``gathered_16_bit``: FSDP gathers 16-bit parameters, so the router makes an fp32 copy of
    its weight in each forward and keeps it."""
    n, k, f = moe.num_experts, moe.top_k, moe.ffn_hidden or 4 * h
    c = expert_capacity(tokens, n, top_k=moe.top_k, capacity_factor=moe.capacity_factor)
    gates = FP32 * tokens * (k + 1) if k > 1 else 0  # top-k gates and their sum
    routing = (FP32 * tokens * h + FP32 * tokens * n + INT64 * tokens * k + gates
               + BOOL * tokens * k + FP32 * n
               + (FP32 * n * h if gathered_16_bit else 0))  # fmt: skip
    buffers = e * (2 * tokens * n * c + n * c * (2 * h + 2 * f))
    terms = {
        "MoE routing (router input, probabilities, choices)": layers * routing,
        "MoE dispatch, experts and combine buffers": layers * buffers,
    }
    if kept is None:
        bound = KEPT_INDICES * layers * min(tokens * k, n * c)
        terms["MoE kept-token indices (capacity bound: an upper bound)"] = bound
    else:
        if chunk not in kept:
            raise ValueError(f"kept has no count for chunk {chunk} in this micro-batch, and the "
                             "chunk holds MoE layers: give one per (chunk, micro-batch)")  # fmt: skip
        terms["MoE kept-token indices"] = KEPT_INDICES * kept[chunk]
    return terms


def context_core_difference(
    spec: ModelSpec, layout: Layout, *, micro_batch: int, bytes_per_element: int, context: str,
    cp_rank: int = 0, split: str = "zigzag",
) -> float:  # fmt: skip
    """Per layer: what the cp ranks' attention core keeps beyond the dense core on s/cp
    tokens that the layers term counts (module docstring)."""
    b, e, t, cp = micro_batch, bytes_per_element, layout.tp, layout.cp
    s, h, a = spec.seq_len, spec.hidden, spec.heads
    s_c = s // cp
    dense_core = 2 * e * b * s_c * h / t + e * b * (a / t) * s_c * s_c  # local K, V; probabilities
    if context == "all_gather":
        return 2 * e * b * s * h / t + e * b * (a / t) * s_c * s + s_c * s - dense_core
    if context == "ulysses":
        return e * b * (a / (t * cp)) * s * s + s * s - e * b * (a / t) * s_c * s_c
    if context == "ring":
        dense_query = e * b * s_c * h / t  # the dense core's query, in the layers term
        ring = ring_core_bytes(spec, layout, micro_batch=b, bytes_per_element=e,
                               cp_rank=cp_rank, split=split)  # fmt: skip
        return ring - dense_core - dense_query
    raise ValueError(f"context={context!r}: only 'ring', 'all_gather' and 'ulysses' are counted")


def ring_pairs(cp: int, cp_rank: int, split: str) -> tuple[int, int, int]:
    """(pairs, steps, query chunks) of :func:`~distlab.parallel.context.ring.ring_attention` on cp
    rank ``cp_rank``: the (query chunk, key chunk) pairs it computes over the ring's cp
    steps (a key chunk wholly after the query chunk is skipped: causal), the steps with
    at least one, and the chunks it holds. Zig-zag: 2 cp + 1 pairs on every rank, in all
    cp steps; contiguous: rank r computes r + 1."""
    mine = chunks_of(cp_rank, cp, split)
    pairs = steps = 0
    for step in range(cp):
        owner = (cp_rank - step) % cp
        visited = sum(1 for i in mine for j in chunks_of(owner, cp, split) if j <= i)
        pairs, steps = pairs + visited, steps + (visited > 0)
    return pairs, steps, len(mine)


def ring_core_bytes(
    spec: ModelSpec, layout: Layout, *, micro_batch: int, bytes_per_element: int,
    cp_rank: int, split: str,
) -> float:  # fmt: skip
    """Per layer: what ring attention keeps for backward on cp rank ``cp_rank`` (module
    docstring), but the local query, which the dense core keeps too."""
    b, e, t = micro_batch, bytes_per_element, layout.tp
    s_c, h, heads = spec.seq_len // layout.cp, spec.hidden, spec.heads / layout.tp
    c = spec.seq_len // chunk_count(layout.cp, split)  # tokens of a chunk
    pairs, steps, chunks = ring_pairs(layout.cp, cp_rank, split)
    kv_blocks = steps * 2 * e * b * s_c * h / t
    per_pair = e * b * heads * c * c + c * c  # probabilities, causal mask
    decays = (pairs - chunks) * e * b * heads * c
    per_chunk = e * b * c * h / t + e * b * heads * c  # output and running sum
    return (
        kv_blocks
        + pairs * per_pair
        + decays
        + chunks * per_chunk
        + ring_query_bytes(spec, layout, micro_batch=b, bytes_per_element=e, pairs=pairs, chunk=c)
    )


def ring_query_bytes(
    spec: ModelSpec, layout: Layout, *, micro_batch: int, bytes_per_element: int, pairs: int,
    chunk: int,
) -> float:  # fmt: skip
    """The queries ring attention keeps: its matmul flattens (batch, heads) of each query
    chunk, a slice of the heads-first view of the linear's output, and with b > 1 that
    needs a copy per pair (e b c h/t each); with b = 1 the slices stay views of the one
    output (e (s/cp) h/t), as the dense core's query does."""
    b, e, h = micro_batch, bytes_per_element, spec.hidden / layout.tp
    if b == 1:
        return e * (spec.seq_len // layout.cp) * h
    return pairs * e * b * chunk * h


def in_flight_peak(
    layout: Layout,
    stage: int,
    forward_bytes: Callable[[int, int], float],
    once: Sequence[float] = (),
) -> float:
    """The most bytes pipeline rank ``stage`` holds at once: walk its actions of the layout's
    schedule, adding ``forward_bytes(c, i)`` (what micro-batch i's forward through chunk c
    keeps) at each forward and freeing them at its backward (``B``, or ``W`` when split into
    ``I`` and ``W``), as the executor does; ``once[c]``, what every micro-batch of chunk c
    saves alike, is held while any of them is."""
    schedule = _schedule(layout)
    once = list(once) or [0.0] * schedule.chunks
    held = peak = 0.0
    in_flight = [0] * schedule.chunks
    for action in schedule.ranks[stage]:
        c = action.chunk
        if action.kind == "F":
            held += forward_bytes(c, action.micro_batch) + (once[c] if not in_flight[c] else 0)
            in_flight[c] += 1
        elif action.kind in ("B", "W"):
            in_flight[c] -= 1
            held -= forward_bytes(c, action.micro_batch) + (once[c] if not in_flight[c] else 0)
        peak = max(peak, held)
    return peak


def layout_activations(
    spec: ModelSpec,
    layout: Layout,
    rank: int,
    *,
    micro_batch: int,
    dropout: float = 0.0,
    bytes_per_element: int = FP32,
    context: str = "ring",
    split: str = "zigzag",
    moe: MoESpec | None = None,
    kept: Mapping[tuple[int, int], int] | None = None,
) -> tuple[float, list[ChunkActivations]]:
    """(peak bytes kept for backward, per-chunk terms of micro-batch 0) for ``rank`` of
    ``layout``: what ``ComposedRun.peak_activation_bytes`` measures (``context``, ``split``:
    ``train``'s; ``moe``: a MoEGPT's MoE layers; ``kept``: the assignments the rank's MoE
    layers kept, by (chunk, micro-batch), one step of the run's ``ComposedRun.moe_kept``;
    without it the MoE indices are the capacity bound, and the peak an upper bound)."""
    where = layout.coordinates(rank)
    stage = where["pp"]
    count = functools.partial(
        chunk_activations, spec, layout, stage, micro_batch=micro_batch, dropout=dropout,
        bytes_per_element=bytes_per_element, context=context, cp_rank=where["cp"], split=split,
        moe=moe,
    )  # fmt: skip
    if kept is None:
        by_micro_batch = [count()] * layout.micro_batches
    else:
        by_micro_batch = [count(kept=_kept_of(kept, i)) for i in range(layout.micro_batches)]
    chunks = by_micro_batch[0]
    peak = in_flight_peak(layout, stage, lambda c, i: by_micro_batch[i][c].total,
                          [c.once_total for c in chunks])  # fmt: skip
    return peak, chunks


def _kept_of(kept: Mapping[tuple[int, int], int], micro_batch: int) -> dict[int, int]:
    return {c: n for (c, i), n in kept.items() if i == micro_batch}


def _schedule(layout: Layout):
    return build(layout.pipeline_schedule, layout.pp, layout.micro_batches,
                 chunks=layout.virtual_stages)  # fmt: skip


def _check_covered(
    layout: Layout, bytes_per_element: int, context: str, moe: MoESpec | None
) -> None:
    """``ValueError`` naming what this count leaves out (module docstring)."""
    if bytes_per_element not in WIDTHS:
        raise ValueError(f"bytes_per_element={bytes_per_element!r}: run activations are counted "
                         "for fp32 (4) and 16-bit autocast runs (2: bf16, fp16)")  # fmt: skip
    if layout.ep > 1 and moe is None:
        raise ValueError(f"ep={layout.ep} needs moe=MoESpec(...): the MoE layers' buffers "
                         "depend on their experts, top-k and capacity factor")  # fmt: skip
    if moe is not None and moe.num_experts % layout.ep:
        raise ValueError(f"num_experts={moe.num_experts} is not divisible by ep={layout.ep}; "
                         "ep must divide it (each ep rank holds num_experts/ep experts)")  # fmt: skip
