"""Communication volume per GPU per training step, and its time on a link.

Each parallelism's traffic is a list of collectives (:class:`CommPart`).
Bytes are counted the way a ring algorithm moves them (Thakur, Rabenseifner
& Gropp 2005; Patarasuk & Yuan 2009): with K ranks and a buffer of n bytes,

* all-reduce: each GPU sends 2 (K-1)/K n bytes in 2 (K-1) messages;
* reduce-scatter and all-gather: (K-1)/K n bytes in K-1 messages
  (n is the full, unsharded buffer);
* broadcast (binomial tree, as distlab's ``tree_broadcast``): each of the K-1
  receivers gets n bytes once, so the K ranks send (K-1) n together, on
  average (K-1)/K n per GPU (the root sends ceil(log2 K) n, leaves nothing),
  in ceil(log2 K) sequential messages;
* send/recv: n bytes in one message.

``.total`` is **bytes sent per GPU** (as many are received). The ZeRO paper
(Rajbhandari et al. 2020, Section 7) counts differently: an all-reduce of Ψ
elements moves 2Ψ, a reduce-scatter or all-gather Ψ, dropping (K-1)/K;
``.zero_paper_bytes`` gives that convention (DDP 2Ψ, ZeRO-1 and 2 also 2Ψ,
ZeRO-3 3Ψ: 1.5 times DDP).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from distlab.core.checks import choice, divides, positive, positive_int
from distlab.sim.cost import (
    ring_all_gather_cost,
    ring_all_reduce_cost,
    ring_reduce_scatter_cost,
    tree_all_reduce_cost,
    tree_broadcast_cost,
)

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv")

#: the ring closed forms (distlab.sim.cost) whose bytes and steps a CommPart counts
_RING = {
    "all_reduce": ring_all_reduce_cost,
    "reduce_scatter": ring_reduce_scatter_cost,
    "all_gather": ring_all_gather_cost,
}
_ZERO_STAGES = (0, 1, 2, 3)
_RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class CommPart:
    """``count`` calls of one collective over ``group_size`` ranks on a
    buffer of ``payload_bytes`` (the full buffer, before any sharding)."""

    what: str
    collective: str
    group_size: int
    payload_bytes: float
    count: float = 1

    def __post_init__(self) -> None:
        choice("collective", self.collective, COLLECTIVES)

    @property
    def bytes_sent(self) -> float:
        """Bytes one GPU sends for all ``count`` calls (ring algorithms: the ``beta`` factor of
        :mod:`distlab.sim.cost`'s ring closed forms times the payload; a broadcast: the
        average over the K ranks, (K-1)/K of the payload)."""
        if self.collective == "send_recv":
            return self.payload_bytes * self.count
        if self.collective == "broadcast":
            k = self.group_size
            return (k - 1) / k * self.payload_bytes * self.count
        factor = _RING[self.collective](self.group_size).beta_factor
        return factor * self.payload_bytes * self.count

    @property
    def messages(self) -> float:
        """Sequential messages (each pays the latency alpha) for all calls, ring algorithms."""
        return self.latency_steps()

    def latency_steps(self, all_reduce: str = "ring") -> float:
        """Sequential messages for all calls. ``all_reduce="tree"`` counts a
        (double) binary tree all-reduce, 2 ceil(log2 K) steps, as NCCL uses at
        scale; ``"auto"`` the smaller of ring and tree. Other collectives are rings."""
        choice("all_reduce", all_reduce, ("ring", "tree", "auto"))
        k = self.group_size
        if k == 1:
            return 0
        if self.collective == "send_recv":
            return self.count
        if self.collective == "broadcast":
            return tree_broadcast_cost(k).alpha_terms * self.count  # ceil(log2 K)
        ring = _RING[self.collective](k).alpha_terms
        if self.collective != "all_reduce":
            return ring * self.count
        tree = tree_all_reduce_cost(k).alpha_terms  # 2 ceil(log2 K)
        steps = {"ring": ring, "tree": tree, "auto": min(ring, tree)}[all_reduce]
        return steps * self.count

    @property
    def zero_paper_bytes(self) -> float:
        """The ZeRO paper's count: all-reduce 2n, reduce-scatter/all-gather/send n."""
        if self.group_size == 1:
            return 0.0
        factor = 2 if self.collective == "all_reduce" else 1
        return factor * self.payload_bytes * self.count


@dataclass(frozen=True)
class CommVolume:
    """The collectives one GPU takes part in during a step; ``.total`` bytes sent."""

    name: str
    parts: tuple[CommPart, ...]

    @property
    def total(self) -> float:
        return sum(p.bytes_sent for p in self.parts)

    @property
    def zero_paper_bytes(self) -> float:
        return sum(p.zero_paper_bytes for p in self.parts)

    @property
    def messages(self) -> float:
        return sum(p.messages for p in self.parts)

    def time_on(self, link, *, all_reduce: str = "ring") -> float:
        """Seconds on ``link`` (a :class:`distlab.sim.topology.Link`), one
        collective after the other: messages x alpha + bytes / bandwidth.

        The bandwidth term is always the ring's (bandwidth-optimal); with
        ``all_reduce="tree"`` or ``"auto"`` all-reduces pay a tree's latency
        instead (see :meth:`CommPart.latency_steps`): a lower bound of what
        NCCL reaches by switching algorithm with message size.
        """
        steps = sum(p.latency_steps(all_reduce) for p in self.parts)
        return time_on_link(self.total, link, messages=steps)


def time_on_link(n_bytes: float, link, *, messages: float = 1) -> float:
    """Alpha-beta time (Hockney 1994): messages x link.alpha + n_bytes / link.bandwidth."""
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
    if messages < 0:
        raise ValueError(f"messages must be >= 0, got {messages!r}")
    return messages * link.alpha + n_bytes / link.bandwidth


def data_parallel_comm(
    n_params: float,
    *,
    dp: int,
    zero_stage: int = 0,
    bytes_per_param: int = 2,
    bytes_per_grad: int = 2,
    micro_batches: int = 1,
) -> CommVolume:
    """Gradient and parameter traffic of DDP and ZeRO over ``dp`` ranks.

    ``n_params`` is the parameters this GPU's model replica holds (divide by
    tp * pp first). Per step (ZeRO paper, Section 7.2):

    * stage 0 (DDP): one all-reduce of the gradients (accumulated locally
      over ``micro_batches``, as DDP's ``no_sync`` does);
    * stage 1: a reduce-scatter of the gradients and an all-gather of the
      updated parameters, Ψ each in the paper's count: the same 2Ψ as DDP's
      all-reduce (Section 7.2.1);
    * stage 2: the gradients are reduce-scattered after every micro-batch
      (each rank keeps only its shard), plus one all-gather of parameters;
    * stage 3 (FSDP): every micro-batch all-gathers the parameters for the
      forward and again for the backward, and reduce-scatters the gradients:
      3Ψ in the paper's count with one micro-batch.
    """
    psi = positive("n_params", n_params)
    k = positive_int("dp", dp)
    choice("zero_stage", zero_stage, _ZERO_STAGES)
    m = positive_int("micro_batches", micro_batches)
    grads = psi * positive_int("bytes_per_grad", bytes_per_grad)
    params = psi * positive_int("bytes_per_param", bytes_per_param)
    if zero_stage == 0:
        parts = (CommPart("gradient all-reduce", "all_reduce", k, grads),)
    elif zero_stage == 1:
        parts = (
            CommPart("gradient reduce-scatter", "reduce_scatter", k, grads),
            CommPart("parameter all-gather", "all_gather", k, params),
        )
    elif zero_stage == 2:
        parts = (
            CommPart("gradient reduce-scatter (per micro-batch)", "reduce_scatter", k, grads, m),
            CommPart("parameter all-gather", "all_gather", k, params),
        )
    else:
        parts = (
            CommPart("parameter all-gather, forward", "all_gather", k, params, m),
            CommPart("parameter all-gather, backward", "all_gather", k, params, m),
            CommPart("gradient reduce-scatter", "reduce_scatter", k, grads, m),
        )
    return CommVolume(f"data parallel, ZeRO stage {zero_stage}", parts)


#: torch DDP's default ``bucket_cap_mb`` (torch/nn/parallel/distributed.py), used by
#: distlab's DDP and ZeRO too; PyTorch's "MB" is a MiB (it multiplies by 1024 * 1024)
DEFAULT_BUCKET_CAP_MB = 25.0
BYTES_PER_MB = 2**20


def bucket_indices(sizes_bytes: Sequence[float], cap_bytes: float) -> list[list[int]]:
    """Cut tensors of ``sizes_bytes`` (in the order their gradients are expected) into
    buckets: lists of indices.

    PyTorch's rule (``torch.distributed._compute_bucket_assignment_by_size``
    with one size limit; Li et al. 2020, Section 3.2.2): add tensors to the
    current bucket until it holds at least ``cap_bytes``, then start a new one;
    so a bucket exceeds the cap by less than its last tensor.
    """
    if not cap_bytes > 0:
        raise ValueError(f"bucket cap must be > 0 bytes, got {cap_bytes!r}")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for i, n in enumerate(sizes_bytes):
        current.append(i)
        size += n
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def zero_flat_groups(
    tensor_elements: Sequence[int],
    *,
    dp: int,
    bytes_per_element: int,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
) -> list[int]:
    """Padded sizes (elements) of the flat groups :class:`distlab.parallel.zero.ZeroOptimizer`
    builds from parameters of ``tensor_elements`` (in ``model.parameters()`` order).

    The parameters are cut into buckets in reverse order (:func:`bucket_indices`,
    ``bucket_cap_mb`` MiB), and each bucket's Ψ_g elements are padded to
    ``dp * ceil(Ψ_g / dp)``, so that the dp shards are equal
    (:mod:`distlab.parallel.flat`; Rajbhandari et al. 2020, Section 5).
    """
    k = positive_int("dp", dp)
    bpe = positive_int("bytes_per_element", bytes_per_element)
    backwards = list(tensor_elements)[::-1]
    cap = positive("bucket_cap_mb", bucket_cap_mb) * BYTES_PER_MB
    groups = bucket_indices([n * bpe for n in backwards], cap)
    return [-(-sum(backwards[i] for i in g) // k) * k for g in groups]


def ddp_bytes_per_gpu(n_params: float, *, dp: int, bytes_per_grad: int = 2) -> float:
    """Bytes each GPU sends per DDP step: 2 (dp-1)/dp x n_params x bytes_per_grad
    (ring all-reduce; 1B bf16 gradients on 8 GPUs: 3.5 GB)."""
    return data_parallel_comm(n_params, dp=dp, bytes_per_grad=bytes_per_grad).total


def fsdp_comm(
    n_params: float, *, dp: int, bytes_per_param: int = 2, micro_batches: int = 1
) -> CommVolume:
    """FSDP (FULL_SHARD) is ZeRO stage 3: see :func:`data_parallel_comm`."""
    return data_parallel_comm(
        n_params,
        dp=dp,
        zero_stage=3,
        bytes_per_param=bytes_per_param,
        bytes_per_grad=bytes_per_param,
        micro_batches=micro_batches,
    )


def tensor_parallel_comm(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers: int,
    tp: int,
    micro_batches: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    bytes_per_element: int = 2,
) -> CommVolume:
    """Megatron tensor parallelism's activation traffic for ``layers`` layers.

    Each layer all-reduces its b x s x h output twice in the forward (after
    attention and after the MLP) and twice in the backward (the gradients of
    their inputs): Shoeybi et al. 2019, "Megatron-LM", Section 3. With
    sequence parallelism (Korthikanti et al. 2022, Section 4.2.2) each
    all-reduce becomes an all-gather plus a reduce-scatter: the same bytes.
    Full recomputation repeats the forward, so its two all-reduces run again.
    Per step: ``micro_batches`` x ``layers`` x those.
    """
    t = positive_int("tp", tp)
    n_layers = positive_int("layers", layers)
    m = positive_int("micro_batches", micro_batches)
    choice("recompute", recompute, _RECOMPUTE)
    payload = (
        positive_int("seq_len", seq_len)
        * positive_int("micro_batch", micro_batch)
        * positive_int("hidden", hidden)
        * positive_int("bytes_per_element", bytes_per_element)
    )
    forwards = 2 if recompute == "full" else 1
    calls = {"forward": 2 * forwards * n_layers * m, "backward": 2 * n_layers * m}
    parts: list[CommPart] = []
    for phase, count in calls.items():
        if sequence_parallel:
            parts.append(CommPart(f"{phase} all-gather (SP)", "all_gather", t, payload, count))
            parts.append(
                CommPart(f"{phase} reduce-scatter (SP)", "reduce_scatter", t, payload, count)
            )
        else:
            parts.append(CommPart(f"{phase} all-reduce", "all_reduce", t, payload, count))
    return CommVolume("tensor parallel", tuple(parts))


def pipeline_parallel_comm(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    micro_batches: int,
    pp: int,
    tp: int = 1,
    virtual_stages: int = 1,
    bytes_per_element: int = 2,
) -> CommVolume:
    """Point-to-point traffic of a middle pipeline stage per step.

    For each micro-batch it sends its output activations (b x s x h) to the
    next stage and the gradient of its input back to the previous one; the
    first and last stages send half of this. With tensor parallelism each of
    the tp ranks sends 1/tp of the tensor (Megatron's scatter/gather
    optimisation, Narayanan et al. 2021, Section 4.1). The interleaved
    schedule with v = ``virtual_stages`` model chunks per rank crosses v times
    more stage boundaries, so it sends v times as many messages (Section 2.2.2):
    m v of each here (the first stage sends m (v-1) gradients, the last
    m (v-1) activations; :func:`three_d_comm`).
    """
    p = positive_int("pp", pp)
    t = positive_int("tp", tp)
    s = positive_int("seq_len", seq_len)
    if p == 1:
        return CommVolume("pipeline parallel", ())
    payload = (
        s
        * positive_int("micro_batch", micro_batch)
        * positive_int("hidden", hidden)
        * positive_int("bytes_per_element", bytes_per_element)
        / t
    )
    count = positive_int("micro_batches", micro_batches) * positive_int(
        "virtual_stages", virtual_stages
    )
    return CommVolume(
        "pipeline parallel",
        (
            CommPart("activations to next stage", "send_recv", 2, payload, count),
            CommPart("gradients to previous stage", "send_recv", 2, payload, count),
        ),
    )


# ------------------------------------------------------- expert parallelism ---
def expert_capacity(
    tokens: int, num_experts: int, *, top_k: int = 1, capacity_factor: float = 1.25
) -> int:
    """Slots per expert on one rank: ``ceil(capacity_factor * tokens * top_k / num_experts)``.

    Switch Transformer (Fedus et al. 2021, Section 2.2, "expert capacity"):
    ``(tokens per batch / experts) x capacity factor``; with top-k routing each
    token makes k assignments, so GShard (Lepikhin et al. 2020, Algorithm 1)
    scales by k. ``tokens`` are the tokens one rank routes (each rank routes its
    own batch). Rounded **up**, so a capacity factor of 1 never drops a token
    of a perfectly balanced batch; the product is rounded to 9 decimals first
    so that e.g. 1.1 x 10 / 1 gives 11, not 12.
    """
    t = positive_int("tokens", tokens)
    e = positive_int("num_experts", num_experts)
    k = positive_int("top_k", top_k)
    if k > e:
        raise ValueError(f"top_k={k} must be <= num_experts={e}")
    factor = positive("capacity_factor", capacity_factor)
    return math.ceil(round(factor * t * k / e, 9))


@dataclass(frozen=True)
class AllToAllPart:
    """``count`` all-to-alls over ``group_size`` ranks of a ``payload_bytes`` buffer
    per rank (the whole buffer, its own block included).

    Pairwise exchange (Thakur, Rabenseifner & Gropp 2005, Section 4.6): each
    rank keeps its own block and sends the other ``K - 1`` blocks, so it
    sends ``(K-1)/K n`` bytes in ``K - 1`` messages per call. Has the same
    properties as :class:`CommPart`, so it can sit in a :class:`CommVolume`.
    """

    what: str
    group_size: int
    payload_bytes: float
    count: float = 1
    collective: str = "all_to_all"

    @property
    def bytes_sent(self) -> float:
        k = self.group_size
        return (k - 1) / k * self.payload_bytes * self.count

    @property
    def messages(self) -> float:
        return self.latency_steps()

    def latency_steps(self, all_reduce: str = "ring") -> float:
        return (self.group_size - 1) * self.count

    @property
    def zero_paper_bytes(self) -> float:
        return self.bytes_sent


def moe_all_to_all_comm(
    *,
    tokens: int,
    hidden: int,
    num_experts: int,
    ep: int,
    top_k: int = 1,
    capacity_factor: float = 1.25,
    moe_layers: int = 1,
    bytes_per_element: int = 2,
) -> CommVolume:
    """All-to-all traffic of expert parallelism per rank per training step.

    Each rank routes its ``tokens`` into a fixed-size buffer of
    ``num_experts x C x hidden`` elements, ``C`` = :func:`expert_capacity`
    (empty slots are padding and are sent too: GShard, Lepikhin et al. 2020,
    Section 2.2 / Algorithm 1; Switch Transformer, Fedus et al. 2021,
    Section 2.2 and Figure 3). Per MoE layer the forward runs two all-to-alls
    over the ``ep`` ranks (dispatch to the experts, combine back), and the
    backward two more (their gradients, the same sizes in reverse; DeepSpeed-MoE,
    Rajbhandari et al. 2022, Section 5): 4 per layer, each sending
    ``(ep-1)/ep x num_experts x C x hidden x bytes_per_element`` bytes.
    (A layer whose input needs no gradient skips the last one.)
    """
    k = positive_int("ep", ep)
    e = positive_int("num_experts", num_experts)
    if e % k:
        raise ValueError(f"num_experts={e} is not divisible by ep={k}; ep must divide it")
    capacity = expert_capacity(tokens, e, top_k=top_k, capacity_factor=capacity_factor)
    payload = (
        e
        * capacity
        * positive_int("hidden", hidden)
        * positive_int("bytes_per_element", bytes_per_element)
    )
    layers = positive_int("moe_layers", moe_layers)
    if k == 1:
        return CommVolume("expert parallel", ())
    return CommVolume(
        "expert parallel",
        (
            AllToAllPart("forward dispatch", k, payload, layers),
            AllToAllPart("forward combine", k, payload, layers),
            AllToAllPart("backward combine gradient", k, payload, layers),
            AllToAllPart("backward dispatch gradient", k, payload, layers),
        ),
    )


# ------------------------------------------------------ vocabulary parallel ---
def vocab_parallel_comm(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    tp: int,
    micro_batches: int = 1,
    first_stage: bool = True,
    last_stage: bool = True,
    bytes_per_element: int = 2,
) -> CommVolume:
    """Tensor-parallel traffic of the vocabulary-parallel embedding, head and loss.

    Megatron-LM (Shoeybi et al. 2019, Section 3) splits the embedding matrix
    by vocabulary rows: the first stage all-reduces the b x s x h embedding
    output (forward only: its input, the tokens, needs no gradient); the last
    stage's head starts with the identity-forward/all-reduce-backward operator,
    one b x s x h all-reduce in the backward. The loss is computed from each
    rank's slice of the logits, exchanging only b x s numbers per token
    (always fp32, 4 bytes): distlab's
    :class:`~distlab.parallel.tensor.vocab.VocabParallelCrossEntropy` all-gathers
    each rank's log-sum-exp (a tp x b x s buffer) and all-reduces the target
    logit (Megatron instead all-reduces the max, the sum of exponentials and
    the target logit: three b x s all-reduces). Per step: ``micro_batches`` x these.
    """
    t = positive_int("tp", tp)
    m = positive_int("micro_batches", micro_batches)
    tokens = positive_int("seq_len", seq_len) * positive_int("micro_batch", micro_batch)
    activation = (
        tokens
        * positive_int("hidden", hidden)
        * positive_int("bytes_per_element", bytes_per_element)
    )
    if t == 1:
        return CommVolume("vocabulary parallel", ())
    parts = []
    if first_stage:
        parts.append(CommPart("embedding output all-reduce", "all_reduce", t, activation, m))
    if last_stage:
        parts += [
            CommPart("head input-gradient all-reduce", "all_reduce", t, activation, m),
            CommPart("loss log-sum-exp all-gather (fp32)", "all_gather", t, t * tokens * 4, m),
            CommPart("loss target-logit all-reduce (fp32)", "all_reduce", t, tokens * 4, m),
        ]
    return CommVolume("vocabulary parallel", tuple(parts))


# ------------------------------------------------------------- 3D composition ---
def three_d_comm(
    spec,
    *,
    tp: int,
    pp: int,
    dp: int,
    micro_batch: int,
    micro_batches: int,
    stage: int,
    bytes_per_element: int = 2,
    zero_stage: int = 0,
    chunks: int = 1,
    layer_buffers: Sequence[int] = (),
) -> dict[str, CommVolume]:
    """Bytes one rank of pipeline stage ``stage`` sends per step of a TP x PP x DP job,
    per process group: distlab's :func:`distlab.parallel.three_d.train_3d` as it runs.

    ``spec`` is a :class:`~distlab.calc.transformer.ModelSpec`; ``micro_batch``
    sequences per micro-batch, ``micro_batches`` (m) per replica; ``chunks`` (v)
    model chunks per rank for the interleaved schedule (1: 1F1B, GPipe or
    ZB-H1, which all send the same messages). Groups:

    * ``"tp"``: :func:`tensor_parallel_comm` for the stage's ``layers / pp``
      layers (however they are cut into chunks) plus :func:`vocab_parallel_comm`
      (embedding on the first stage, head and loss on the last);
    * ``"pp"``: :func:`pipeline_parallel_comm`'s sends with ``virtual_stages=v``,
      those this stage makes. Chunk c of stage s is virtual stage c p + s; every
      virtual stage but the last sends its activations once per micro-batch and
      every one but the first its input's gradient, so stage s sends
      m (v - [s = p-1]) activations and m (v - [s = 0]) gradients: v times the
      boundaries of 1F1B (Narayanan et al. 2021, Section 2.2.2). Every tp rank
      sends the whole b x s x h tensor, as distlab does (``tp=1`` there:
      Megatron's scatter/gather would send 1/tp of it);
    * ``"embedding"``: with tied embeddings and pp > 1, the first and last
      stages swap their parts of the embedding's gradient (one message each,
      ``ceil(V/tp) x h``; Narayanan et al. 2021, Section 3);
    * ``"dp"``, over the rank's parameters
      (:func:`~distlab.calc.transformer.rank_parameter_tensors`):

      - ``zero_stage=0``: :func:`data_parallel_comm`'s gradient all-reduce as
        one all-reduce per parameter tensor (``train_3d`` averages tensor by
        tensor, no buckets);
      - ``zero_stage=1``: :func:`data_parallel_comm` with ``zero_stage=1`` per
        flat group of :class:`~distlab.parallel.zero.ZeroOptimizer`
        (:func:`zero_flat_groups`: 25 MiB buckets, each padded to a multiple
        of dp): one reduce-scatter of the gradients and one all-gather of the
        updated parameters, 2 (dp-1)/dp Ψ_g per group, as much as the
        all-reduce it replaces (Rajbhandari et al. 2020, Section 7.2.1). Plus,
        **once per run, not per step**, the broadcast of every parameter and
        buffer (``layer_buffers``: elements of each layer's buffers, such as
        distlab's GPT's causal mask) from the dp group's first rank, when the
        optimizer is built (:func:`~distlab.parallel.comm.broadcast_module_state`):
        a trace of k steps holds k times the other parts and this one once;

      and on the last stage the all-reduce of the loss (one float64) for the
      step's report.

    Not modelled: the shape headers distlab's pipeline executor sends before
    each tensor (8 int64, 64 bytes), and the one-time checks when the model is
    built (they run outside :class:`~distlab.parallel.comm.Collectives`).
    Empty volumes for groups of one rank.
    """
    from .transformer import rank_parameter_tensors

    choice("zero_stage", zero_stage, (0, 1))
    v = positive_int("chunks", chunks)
    divides("pp * chunks", pp * v, "layers", spec.layers)
    if pp == 1 and v > 1:  # as train_3d: one stage has no boundary to interleave
        raise ValueError(f"chunks={v} needs pp >= 2: one pipeline stage has nothing to interleave")
    shape = {"seq_len": spec.seq_len, "micro_batch": micro_batch, "hidden": spec.hidden}
    m, bpe = micro_batches, bytes_per_element
    first, last = stage == 0, stage == pp - 1
    tensors = rank_parameter_tensors(spec, tp=tp, pp=pp, stage=stage)
    tp_parts = tensor_parallel_comm(
        **shape, layers=spec.layers // pp, tp=tp, micro_batches=m, bytes_per_element=bpe
    ).parts
    tp_parts += vocab_parallel_comm(
        **shape, tp=tp, micro_batches=m, first_stage=first, last_stage=last, bytes_per_element=bpe
    ).parts
    sends = pipeline_parallel_comm(
        **shape, micro_batches=m, pp=pp, tp=1, virtual_stages=v, bytes_per_element=bpe
    ).parts  # (activations to next stage, gradients to previous stage), m v of each
    counts = (m * (v - int(last)), m * (v - int(first)))
    pp_parts = tuple(replace(part, count=n) for part, n in zip(sends, counts) if n)
    tied = spec.tied_embeddings and pp > 1 and (first or last)
    embedding = (-(-spec.vocab // tp)) * spec.hidden * bpe
    tied_parts = (CommPart("tied embedding gradient", "send_recv", 2, embedding),) if tied else ()
    dp_parts: tuple = ()
    if dp > 1:
        if zero_stage == 0:
            dp_parts = _gradient_all_reduces(tensors, dp=dp, bytes_per_element=bpe)
        else:
            buffers = tuple(layer_buffers) * (spec.layers // pp)
            dp_parts = _zero1_flat_groups(tensors, dp=dp, bytes_per_element=bpe)
            dp_parts += _setup_broadcasts(tensors + buffers, dp=dp, bytes_per_element=bpe)
        if last:
            dp_parts += (CommPart("loss average (float64)", "all_reduce", dp, 8),)
    return {
        "tp": CommVolume("tensor parallel", tp_parts if tp > 1 else ()),
        "pp": CommVolume("pipeline parallel", pp_parts),
        "embedding": CommVolume("tied embedding", tied_parts),
        "dp": CommVolume("data parallel", dp_parts),
    }


def _gradient_all_reduces(tensors, *, dp: int, bytes_per_element: int) -> tuple[CommPart, ...]:
    """One all-reduce per tensor: one part per tensor size, exact in integers."""
    parts: tuple[CommPart, ...] = ()
    for size, n in sorted(Counter(tensors).items()):
        (grads,) = data_parallel_comm(size, dp=dp, bytes_per_grad=bytes_per_element).parts
        parts += (replace(grads, what=f"gradient all-reduce, {size}-element tensors", count=n),)
    return parts


def _zero1_flat_groups(tensors, *, dp: int, bytes_per_element: int) -> tuple[CommPart, ...]:
    """ZeRO-1's reduce-scatter and all-gather of each padded flat group (one part per size)."""
    bpe = bytes_per_element
    flat = zero_flat_groups(tensors, dp=dp, bytes_per_element=bpe)
    parts: tuple[CommPart, ...] = ()
    for size, n in sorted(Counter(flat).items()):
        volume = data_parallel_comm(size, dp=dp, zero_stage=1, bytes_per_param=bpe,
                                    bytes_per_grad=bpe)  # fmt: skip
        parts += tuple(
            replace(p, what=f"{p.what}, {size}-element flat groups", count=n) for p in volume.parts
        )
    return parts


def _setup_broadcasts(tensors, *, dp: int, bytes_per_element: int) -> tuple[CommPart, ...]:
    """One broadcast per parameter and buffer when ZeRO is built: once per run."""
    what = "broadcast at construction (once per run), {}-element tensors"
    sizes = Counter(t for t in tensors if t)  # empty tensors are not broadcast
    return tuple(
        CommPart(what.format(size), "broadcast", dp, size * bytes_per_element, n)
        for size, n in sorted(sizes.items())
    )
