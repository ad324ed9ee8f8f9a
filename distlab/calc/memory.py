"""Memory per GPU: model states (parameters, gradients, optimizer states) and activations.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", Section 3.1 and
Section 5.1 with Figure 1 and Table 1). With Ψ parameters, mixed-precision
Adam keeps 2Ψ bytes of fp16 parameters, 2Ψ of fp16 gradients and KΨ of
optimizer state, where K = 12 counts the fp32 master copy of the parameters
(4) and Adam's momentum (4) and variance (4). ZeRO-DP over Nd ranks then
keeps, per GPU:

====================  =====================================
stage 0 (plain DP)    (2 + 2 + K) Ψ
stage 1 (P_os)        2Ψ + 2Ψ + KΨ / Nd
stage 2 (P_os+g)      2Ψ + (2 + K) Ψ / Nd
stage 3 (P_os+g+p)    (2 + 2 + K) Ψ / Nd
====================  =====================================

Activations follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", Section 4, Table 2), in bytes per
transformer layer with 16-bit activations; see :func:`activation_bytes_per_layer`.

Everything is in bytes; divide by :data:`~distlab.core.units.GB` (1e9, the
papers' GB) or :data:`~distlab.core.units.GiB` (2^30) to print.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.core.checks import choice, divides, positive, positive_int
from distlab.core.layout import RECOMPUTE_MODES, ZERO_STAGES

from .pipeline import SCHEDULES, in_flight_micro_batches


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter a training recipe keeps: weights, gradients, optimizer state.

    ``optimizer_bytes`` is the ZeRO paper's K: everything only the optimizer
    needs, including an fp32 master copy of the weights when there is one;
    ``master_bytes`` is that copy's share of K (0 without one).
    """

    name: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    description: str
    master_bytes: int = 0

    @property
    def bytes_per_param(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


RECIPES: dict[str, Recipe] = {
    "mixed_adam": Recipe(
        "mixed_adam",
        2,
        2,
        12,
        "fp16/bf16 weights and gradients; fp32 master weights + Adam m and v "
        "(K = 12, ZeRO paper Section 3.1): 16 bytes/param",
        master_bytes=4,
    ),
    "fp32_adam": Recipe(
        "fp32_adam", 4, 4, 8, "fp32 weights and gradients, Adam m and v in fp32: 16 bytes/param"
    ),
    "bf16_adam": Recipe(
        "bf16_adam",
        2,
        2,
        4,
        "pure bf16, no master copy: weights, gradients and Adam m, v all in bf16 "
        "(what torch.optim.Adam keeps for a bf16 model): 8 bytes/param",
    ),
    "sgd_momentum": Recipe(
        "sgd_momentum",
        4,
        4,
        4,
        "fp32 weights and gradients, one fp32 momentum buffer: 12 bytes/param",
    ),
    "sgd": Recipe(
        "sgd", 4, 4, 0, "fp32 weights and gradients, plain SGD keeps no state: 8 bytes/param"
    ),
}


def get_recipe(name: str) -> Recipe:
    """The :class:`Recipe` called ``name`` (see :data:`RECIPES`)."""
    choice("recipe", name, RECIPES)
    return RECIPES[name]


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of model state on one GPU; ``.total`` is their sum."""

    parameters: float
    gradients: float
    optimizer_states: float
    params_per_gpu_before_zero: float
    recipe: str
    zero_stage: int
    dp: int
    tp: int
    pp: int

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states


def model_state_bytes(
    n_params: float,
    *,
    recipe: str = "mixed_adam",
    zero_stage: int = 0,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
) -> ModelStateBytes:
    """Parameter, gradient and optimizer-state bytes per GPU.

    Tensor (``tp``) and pipeline (``pp``) parallelism split the weights first:
    each GPU holds Ψ = n_params / (tp * pp) (an even split; real stages differ
    by their embeddings). ZeRO then partitions over the ``dp`` data-parallel
    ranks exactly as the ZeRO paper's Section 5 defines the stages:

    * stage 1 (P_os) divides the optimizer states (including the fp32 master
      weights) by ``dp``;
    * stage 2 (P_os+g) also the gradients;
    * stage 3 (P_os+g+p, what FSDP's FULL_SHARD does) also the parameters.

    ``model_state_bytes(7.5e9, zero_stage=1, dp=64).total / 1e9`` is 31.4
    (Figure 1 of the paper: 120, 31.4, 16.6 and 1.9 GB for stages 0-3). The
    paper's GB is 10^9 bytes. Transient buffers (an fp32 copy of the
    gradients during the step, gathered parameters) are not model state; see
    :func:`peak_bytes`.
    """
    n_params = positive("n_params", n_params)
    rec = get_recipe(recipe)
    choice("zero_stage", zero_stage, ZERO_STAGES)
    dp, tp, pp = positive_int("dp", dp), positive_int("tp", tp), positive_int("pp", pp)
    psi = n_params / (tp * pp)
    params = rec.param_bytes * psi
    grads = rec.grad_bytes * psi
    optim = rec.optimizer_bytes * psi
    if zero_stage >= 1:
        optim /= dp
    if zero_stage >= 2:
        grads /= dp
    if zero_stage >= 3:
        params /= dp
    return ModelStateBytes(params, grads, optim, psi, recipe, zero_stage, dp, tp, pp)


def activation_bytes_per_layer(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    flash_attention: bool = False,
    dropout: bool = True,
    bytes_per_element: int = 2,
) -> float:
    """Bytes of activations one transformer layer keeps for the backward pass, per GPU.

    Korthikanti et al. 2022, Section 4 and Table 2, with s = ``seq_len``,
    b = ``micro_batch``, h = ``hidden``, a = ``heads``, t = ``tp``, 16-bit
    activations and 1-byte dropout masks:

    ===========================================  ==========================
    no parallelism                               sbh (34 + 5as/h)
    tensor parallel                              sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel                   sbh/t (34 + 5as/h)
    selective recompute (TP, TP+SP)              the 5as/h term is dropped
    full recompute                               2sbh (the layer's input)
    ===========================================  ==========================

    Where the 34 comes from (Section 4.1, per layer): attention block 11sbh
    (layer-norm output 2, Q and K 4, V 2, output-projection input 2, dropout
    mask 1) plus 5as²b (softmax output 2, its dropout mask 1, dropout output
    2); MLP 19sbh (input 2, GeLU input 8, GeLU output 8, dropout mask 1);
    two layer norms 4sbh. Without sequence parallelism the 10sbh of layer-norm
    and dropout tensors are replicated on every tensor-parallel rank.

    ``recompute="selective"`` recomputes the attention core (QK^T, softmax,
    dropout, attention over V) and drops the 5as/h term. ``flash_attention``
    has the same effect: a fused attention kernel never stores the s x s
    scores (it keeps the output and a per-row log-sum-exp, which this
    accounting ignores, and regenerates dropout from the RNG state).
    ``recompute="full"`` keeps only each layer's input, 2sbh, as in Table 2;
    with sequence parallelism that input is itself split along the sequence,
    so this function returns 2sbh/t there (Table 2 lists 2sbh, the value
    without sequence parallelism).

    Two settings generalise the table to the run in front of you (the defaults give
    the table): ``dropout=False`` drops the dropout terms (the masks, 1 byte per
    element: 2sbh and as²b, and the dropout output, 2as²b); ``bytes_per_element``
    is the activations' size (4 for fp32; the masks stay 1 byte). The 34 then reads
    (4e + 2·dropout) replicated + 12e split + (e(1 + dropout) + dropout)as/h
    scores, and full recomputation keeps e·sbh.
    """
    s = positive_int("seq_len", seq_len)
    b = positive_int("micro_batch", micro_batch)
    h = positive_int("hidden", hidden)
    a = positive_int("heads", heads)
    t = positive_int("tp", tp)
    choice("recompute", recompute, RECOMPUTE_MODES)
    divides("tp", t, "heads", a)
    if sequence_parallel:
        divides("tp", t, "seq_len", s)
    e = positive_int("bytes_per_element", bytes_per_element)
    masks = 1 if dropout else 0  # one byte per element of each dropout mask
    sbh = s * b * h
    if recompute == "full":
        return e * sbh / (t if sequence_parallel else 1)
    replicated = 4 * e + 2 * masks  # layer-norm inputs, QKV and fc1 inputs (+ 2 dropout masks)
    split = 12 * e  # Q, K, V, the projection's input, GeLU's input and output: over t
    scores = e * (1 + masks) + masks  # softmax output (+ dropout output and mask), x as/h
    score_term = 0.0 if (recompute == "selective" or flash_attention) else scores * a * s / h
    if sequence_parallel:
        return sbh / t * (replicated + split + score_term)
    return sbh * (replicated + split / t + score_term / t)


def gpt_layer_params(hidden: int) -> int:
    """Parameters of one GPT layer: 12h² + 13h (QKV 3h²+3h, projection h²+h,
    MLP 8h²+5h, two layer norms 4h; Narayanan et al. 2021, Section 5.1)."""
    h = positive_int("hidden", hidden)
    return 12 * h * h + 13 * h


@dataclass(frozen=True)
class PeakMemory:
    """A planner-level estimate of the most memory one GPU needs during a step.

    ``activations``: stored activations of the micro-batches in flight on the
    worst (first) pipeline stage. ``recompute_workspace``: with full
    recomputation, one layer's activations rebuilt during its backward.
    ``gathered_parameters``: with ZeRO-3/FSDP, the largest layer's full
    parameters and gradients while it runs. ``logits``: the last stage's fp32 logits
    the loss keeps (0 without a vocabulary), next to that stage's own activations,
    ``last_stage_activations``: with pp > 1 the peak is the larger of the two stages'.
    """

    model_states: ModelStateBytes
    activations: float
    recompute_workspace: float
    gathered_parameters: float
    activation_per_layer: float
    layers_per_stage: int
    in_flight_micro_batches: float
    logits: float = 0.0
    last_stage_activations: float = 0.0

    @property
    def peak_activations(self) -> float:
        """The first stage's activations, or the last stage's with its logits if larger
        (one GPU holds both with pp = 1)."""
        return max(self.activations, self.last_stage_activations + self.logits)

    @property
    def total(self) -> float:
        return (
            self.model_states.total
            + self.peak_activations
            + self.recompute_workspace
            + self.gathered_parameters
        )


def peak_bytes(
    *,
    n_params: float,
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    micro_batch: int,
    micro_batches: int = 1,
    recipe: str = "mixed_adam",
    zero_stage: int = 0,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    flash_attention: bool = False,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    largest_layer_params: float | None = None,
    vocab: int | None = None,
) -> PeakMemory:
    """Model states + activations in flight + ZeRO-3's gathered layer, per GPU.

    * model states: :func:`model_state_bytes`;
    * activations: :func:`activation_bytes_per_layer` x (layers / pp) x the
      micro-batches in flight on the first stage
      (:func:`~distlab.calc.pipeline.in_flight_micro_batches`: GPipe m,
      1F1B min(p, m), interleaved p + (p-1)/v; Korthikanti et al. 2022,
      Section 4.2.3). With pp = 1 and gradient accumulation one micro-batch
      is in flight (GPipe keeps all m);
    * full recomputation also rebuilds one layer's activations at a time;
    * ZeRO-3 / FSDP gathers one layer's full parameters (and produces its full
      gradient before the reduce-scatter): (param + grad bytes) x the largest
      layer's parameters / tp. ``largest_layer_params`` defaults to a GPT
      layer, 12h² + 13h; pass the embedding size if that is larger;
    * with ``vocab``, the logits: the loss keeps the last stage's logits in fp32,
      b s ceil(V/tp) x 4 bytes per micro-batch, whatever the matmuls ran in (as
      distlab's vocabulary-parallel loss does: :mod:`distlab.calc.run_activations`
      checks it against a run), for the micro-batches in flight there (1 after
      1F1B's warm-up, m under GPipe). For a 128K vocabulary that is a large term:
      Llama 3's 128,256 rows at 8,192 tokens are 4.2 GB per sequence before tp.

    Not counted: the rest of what a run keeps outside its layers (layer-norm
    statistics, the embedding's indices), what ``torch.autocast`` adds when the
    parameters stay fp32 (an fp32 residual stream, each linear's own 16-bit copies of
    its input and weight) and MoE layers' routing and expert buffers (all counted for
    distlab's runs by :mod:`distlab.calc.run_activations`), communication buffers, the
    CUDA context and allocator fragmentation (leave headroom).
    """
    n_layers = positive_int("layers", layers)
    p = positive_int("pp", pp)
    divides("pp", p, "layers", n_layers)
    choice("schedule", schedule, SCHEDULES)
    rec = get_recipe(recipe)
    states = model_state_bytes(n_params, recipe=recipe, zero_stage=zero_stage, dp=dp, tp=tp, pp=p)
    act_kwargs = {
        "seq_len": seq_len,
        "micro_batch": micro_batch,
        "hidden": hidden,
        "heads": heads,
        "tp": tp,
        "sequence_parallel": sequence_parallel,
        "flash_attention": flash_attention,
    }
    per_layer = activation_bytes_per_layer(recompute=recompute, **act_kwargs)
    in_flight = in_flight_micro_batches(
        p, micro_batches, schedule=schedule, virtual_stages=virtual_stages
    )
    layers_per_stage = n_layers // p
    activations = per_layer * layers_per_stage * in_flight
    workspace = 0.0
    if recompute == "full":
        workspace = activation_bytes_per_layer(recompute="none", **act_kwargs)
    gathered = 0.0
    if zero_stage == 3 and dp > 1:
        largest = gpt_layer_params(hidden) if largest_layer_params is None else largest_layer_params
        largest = positive("largest_layer_params", largest)
        gathered = (rec.param_bytes + rec.grad_bytes) * largest / tp
    logits = 0.0
    if vocab is not None:
        rows = -(-positive_int("vocab", vocab) // positive_int("tp", tp))
        logits = 4 * positive_int("micro_batch", micro_batch) * seq_len * rows
    last_in_flight = in_flight if p == 1 else (micro_batches if schedule == "gpipe" else 1)
    last_stage = per_layer * layers_per_stage * last_in_flight
    return PeakMemory(
        states, activations, workspace, gathered, per_layer, layers_per_stage, in_flight,
        logits * last_in_flight, last_stage,
    )  # fmt: skip


def fits(*, gpu_memory_bytes: float, headroom_bytes: float = 0.0, **peak_kwargs) -> bool:
    """True if :func:`peak_bytes` (called with ``peak_kwargs``) plus
    ``headroom_bytes`` is at most ``gpu_memory_bytes``."""
    capacity = positive("gpu_memory_bytes", gpu_memory_bytes)
    if headroom_bytes < 0:
        raise ValueError(f"headroom_bytes must be >= 0, got {headroom_bytes!r}")
    return peak_bytes(**peak_kwargs).total + headroom_bytes <= capacity


# -- DeepSpeed's estimator, by name -----------------------------------------------

DEEPSPEED_GB = 2**30
"""What DeepSpeed's memory estimator divides by before it prints "GB" (a GiB)."""


@dataclass(frozen=True)
class DeepSpeedEstimate:
    """Model-state bytes per GPU as DeepSpeed's estimator counts them, mixed-precision Adam.

    From ``estimate_zero2_model_states_mem_needs`` and
    ``estimate_zero3_model_states_mem_needs`` (``deepspeed.runtime.zero``,
    their ``cpu_offload=False`` branches), with Ψ parameters on N GPUs and L
    parameters in the largest layer:

    ======  ===================  =============================================
    ZeRO-2  4Ψ + 16Ψ/N           16-bit weights and gradients whole; fp32
                                 master, Adam m and v, and an fp32 gradient
                                 partition sharded (12 + 4)
    ZeRO-3  4L + 18Ψ/N           one gathered layer's 16-bit weights and
                                 gradients; 16-bit weight shard, fp32 master,
                                 m, v and fp32 gradient partition (2 + 12 + 4)
    ======  ===================  =============================================

    Next to the ZeRO paper (:func:`model_state_bytes`, ``mixed_adam``): the 4
    bytes of an fp32 gradient partition (``fp32_gradients``) are the extra.
    DeepSpeed's ZeRO-2 count is the paper's *stage 1* (4Ψ + 12Ψ/N) plus them:
    it keeps the 16-bit gradients whole, where the paper's stage 2 shards
    them. Its ZeRO-3 count is the paper's stage 3 plus them, less the paper's
    2Ψ/N of 16-bit gradient shard (``paper_gradients_left_out``), plus the
    gathered layer. Its printout divides by 2^30 and says "GB":
    :attr:`printed_gb`.
    """

    replicated: float  # 4Ψ (ZeRO-2) or 4L (ZeRO-3)
    sharded: float  # 16Ψ/N (ZeRO-2) or 18Ψ/N (ZeRO-3)
    fp32_gradients: float  # the 4Ψ/N of `sharded` that the ZeRO paper does not count
    paper_gradients_left_out: float  # ZeRO-3: the paper's 2Ψ/N of 16-bit gradient shard
    zero_stage: int
    dp: int

    @property
    def total(self) -> float:
        return self.replicated + self.sharded

    @property
    def printed_gb(self) -> float:
        """The number DeepSpeed prints, followed by "GB": bytes / 2^30."""
        return self.total / DEEPSPEED_GB


def deepspeed_estimate(
    n_params: float, *, zero_stage: int, dp: int = 1, largest_layer_params: float = 0.0
) -> DeepSpeedEstimate:
    """DeepSpeed's per-GPU model-state estimate at ZeRO stage 2 or 3 (see
    :class:`DeepSpeedEstimate`); ``largest_layer_params`` is used at stage 3 only.

    ``deepspeed_estimate(7.5e9, zero_stage=3, dp=64).total`` is 18 x 7.5e9 / 64
    bytes, 2.11e9, printed as 1.96 "GB"; the paper's count is 1.875e9 bytes.
    """
    psi = positive("n_params", n_params)
    choice("zero_stage", zero_stage, (2, 3))
    dp = positive_int("dp", dp)
    if zero_stage == 2:
        return DeepSpeedEstimate(4 * psi, 16 * psi / dp, 4 * psi / dp, 0.0, 2, dp)
    layer = positive("largest_layer_params", largest_layer_params) if largest_layer_params else 0.0
    return DeepSpeedEstimate(4 * layer, 18 * psi / dp, 4 * psi / dp, 2 * psi / dp, 3, dp)
