"""What one rank of a composed run keeps for backward, term by term (the bytes its peak is
checked against).

:func:`distlab.calc.memory.activation_bytes_per_layer` is Korthikanti et al.'s count of one
transformer layer. A run keeps more, and the pipeline decides how many micro-batches'
worth at once. For one rank of a :class:`~distlab.core.layout.Layout` running
:func:`distlab.parallel.compose.train` on a dense GPT, per micro-batch of b sequences of
s tokens (e bytes per activation: 4 in fp32), per model chunk the rank runs:

* **layers**: Korthikanti et al. 2022, Table 2, for the chunk's layers:
  ``activation_bytes_per_layer(..., dropout=p > 0, bytes_per_element=e)``, one term, so
  the paper's table reads the same here as in notebook 07;
* **layer-norm statistics**: every LayerNorm keeps a mean and a 1/std per token, in fp32,
  for its backward (8 bytes a token; two norms a layer): not in the paper's count
  (:mod:`distlab.parallel.tensor.activations` measures them apart); over t with sequence
  parallelism; none under full recomputation (the norm is recomputed);
* **embedding** (the chunk holding the first part): the token ids the lookup keeps
  (int64, b s), the position ids (int64, s) and the vocabulary-parallel embedding's
  mask of the tokens this rank's rows hold, multiplied into its output (b s elements of
  e bytes);
* **final norm and head** (the chunk holding the last part): the final LayerNorm's
  input and statistics and the output layer's input (e b s h each, over t with sequence
  parallelism, whose output layer keeps its local slice and gathers it again in
  backward), and the **logits and loss**: the vocabulary-parallel cross-entropy keeps the
  rank's logits in fp32 whatever the matmuls ran in (b s ceil(V/t) x 4 bytes), the
  log-sum-exp per token (fp32), the targets shifted to its rows (int64) and which of
  them are its own (1 byte);
* **context parallelism** (cp > 1): every term above on the rank's s/cp tokens, and one
  term for how its attention core differs from the dense core the layers term counts
  (local Q, K, V and s/cp x s/cp probabilities): Llama 3's K/V all-gather (Section
  3.3.2) keeps the gathered K and V (2 e b s h/t, instead of the local ones), the
  probabilities of its queries over the whole sequence (e b (a/t) (s/cp) s) and the
  boolean causal mask ((s/cp) s bytes); DeepSpeed-Ulysses keeps Q, K and V re-split by
  heads (the same bytes as the local ones), the probabilities of a/(t cp) heads over the
  whole sequence (e b (a/(t cp)) s^2) and the mask (s^2 bytes); ring
  attention (:func:`~distlab.parallel.context.ring_attention`, :func:`ring_core_bytes`)
  keeps every K/V block it attended with (one per ring step: ``2 e b (s/cp) h/t`` each),
  and per (query chunk, key chunk) pair it visits, c tokens each, the probabilities
  (e b (a/t) c^2), the causal mask (c^2 bytes) and a copy of the query chunk for the
  matmul (e b c h/t; :func:`ring_query_bytes`), plus per pair
  after a chunk's first the softmax's decay factor (e b (a/t) c) and per query chunk its
  output and running sum (e b c h/t, e b (a/t) c); which pairs it visits depends on the
  split (:mod:`distlab.core.sequence_split`) and, for the contiguous one, on the rank
  (:func:`ring_pairs`);
* **in flight**: the executor adds a chunk's bytes at each forward and frees them at its
  backward (B, or W when the backward is split), so the rank's peak is the largest sum
  over its schedule's actions in order (:func:`in_flight_peak`): 1F1B holds up to
  p - r micro-batches on rank r, GPipe all m.

With ``recompute="selective"`` the context-parallel core is checkpointed as the dense one
is: both keep only the core's inputs (Q, K, V), so there is no context-parallel term.

Not counted, and refused by name: MoE layers (their dispatch and combine buffers, and the
indices of the tokens each expert keeps, which combine saves: how many the router keeps
is known only when it has routed) and
16-bit runs (autocast keeps 16-bit copies of the weights, shared by the micro-batches,
and computes layer norms and softmax in fp32). Each would be a term of its own. FSDP changes nothing here: the gathered weights a layer keeps for
backward are model state, not activations (FSDP frees their storage after the forward
and gathers them again for the backward), and the executor counts them as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.core.layout import Layout
from distlab.core.pipeline_schedule import build
from distlab.core.sequence_split import chunk_count, chunks_of

from .memory import activation_bytes_per_layer
from .transformer import ModelSpec

FP32 = 4
INT64 = 8
LAYER_NORM_STATS = 2 * FP32  # mean and 1/std, per token and norm


@dataclass(frozen=True)
class ChunkActivations:
    """Bytes one micro-batch's forward through one model chunk keeps, by term."""

    chunk: int
    terms: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.terms.values())


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
) -> list[ChunkActivations]:
    """Per model chunk of pipeline rank ``stage``, the bytes one micro-batch keeps (module
    docstring), for a dense GPT ``spec`` trained under ``layout`` (``context`` and
    ``split``: how the cp ranks attend and cut the sequence, as ``train``'s; ``cp_rank``:
    the rank's place in its cp group, which the ring's contiguous split depends on)."""
    _check_covered(layout, bytes_per_element, context)
    schedule = _schedule(layout)
    parts = schedule.stages * schedule.chunks // (2 if schedule.bidirectional else 1)
    per_part = spec.layers // parts
    b, s, h, e = micro_batch, spec.seq_len // layout.cp, spec.hidden, bytes_per_element
    t = layout.tp
    pieces = t if layout.sequence_parallel else 1  # what the sequence is cut into between layers
    full = layout.recompute == "full"
    out = []
    for chunk in range(schedule.chunks):
        part = schedule.model_part(schedule.virtual_stage(stage, chunk))
        layer = activation_bytes_per_layer(
            seq_len=s,
            micro_batch=b,
            hidden=h,
            heads=spec.heads,
            tp=t,
            sequence_parallel=layout.sequence_parallel,
            recompute=layout.recompute,
            dropout=dropout > 0,
            bytes_per_element=e,
        )
        norms = 0.0 if full else per_part * 2 * LAYER_NORM_STATS * b * s / pieces
        terms = {
            "layers (Korthikanti et al. 2022, Table 2)": per_part * layer,
            "layer-norm statistics": norms,
        }
        if layout.cp > 1 and layout.recompute == "none":
            core = context_core_difference(spec, layout, micro_batch=b, bytes_per_element=e,
                                           context=context, cp_rank=cp_rank, split=split)  # fmt: skip
            terms[f"context-parallel attention ({context}) beyond the dense core"] = per_part * core
        if part == 0:
            terms["embedding (ids, positions, vocabulary mask)"] = (
                INT64 * b * s + INT64 * s + e * b * s
            )
        if part == parts - 1:
            terms["final norm and head input"] = (
                2 * e * b * s * h + LAYER_NORM_STATS * b * s
            ) / pieces
            vocab_rows = -(-spec.vocab // t)
            terms["logits and loss (fp32)"] = FP32 * b * s * vocab_rows + (FP32 + INT64 + 1) * b * s
        out.append(ChunkActivations(chunk, terms))
    return out


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
    """(pairs, steps, query chunks) of :func:`~distlab.parallel.context.ring_attention` on cp
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


def in_flight_peak(layout: Layout, stage: int, chunk_bytes: list[float]) -> float:
    """The most bytes pipeline rank ``stage`` holds at once: walk its actions of the layout's
    schedule, adding chunk c's bytes at each forward and freeing them at its backward
    (``B``, or ``W`` when split into ``I`` and ``W``), as the executor does."""
    schedule = _schedule(layout)
    held = peak = 0.0
    for action in schedule.ranks[stage]:
        if action.kind == "F":
            held += chunk_bytes[action.chunk]
        elif action.kind in ("B", "W"):
            held -= chunk_bytes[action.chunk]
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
) -> tuple[float, list[ChunkActivations]]:
    """(peak bytes kept for backward, per-chunk terms) for ``rank`` of ``layout``: what
    ``ComposedRun.peak_activation_bytes`` measures (``context``, ``split``: ``train``'s)."""
    where = layout.coordinates(rank)
    stage = where["pp"]
    chunks = chunk_activations(
        spec, layout, stage, micro_batch=micro_batch, dropout=dropout,
        bytes_per_element=bytes_per_element, context=context, cp_rank=where["cp"], split=split,
    )  # fmt: skip
    return in_flight_peak(layout, stage, [c.total for c in chunks]), chunks


def _schedule(layout: Layout):
    return build(layout.pipeline_schedule, layout.pp, layout.micro_batches,
                 chunks=layout.virtual_stages)  # fmt: skip


def _check_covered(layout: Layout, bytes_per_element: int, context: str) -> None:
    """``ValueError`` naming what this count leaves out (module docstring)."""
    reasons = []
    if layout.ep > 1:
        reasons.append(f"ep={layout.ep}: the MoE layers' dispatch and combine buffers, and the "
                       "indices of the kept tokens, whose count the routing decides")  # fmt: skip
    if bytes_per_element != FP32:
        reasons.append(f"{bytes_per_element}-byte activations: autocast's 16-bit weight copies")
    if reasons:
        raise ValueError("run activations are counted for dense fp32 runs; not modelled: "
                         + "; ".join(reasons))  # fmt: skip
