"""When tensor parallelism stops paying: a layer's compute against its TP collectives.

Notebook 06 asks when data parallelism's gradient all-reduce hides behind compute;
this module asks the same of tensor parallelism, per transformer layer, with the
library's own counts: FLOPs from :mod:`distlab.calc.flops`, bytes and messages from
:func:`distlab.calc.comm.tensor_parallel_comm`, seconds from
:meth:`~distlab.calc.volume.CommVolume.time_on`.

**The roofline.** Notation: t the TP degree; T = b s the tokens of one micro-batch;
h the hidden size; P the parameters of one layer (12 h² for a GPT layer with F = 4h);
e bytes per activation element (2 for bf16); C the FLOP/s one GPU sustains (peak times
an efficiency); W the link's bytes/s in one direction, alpha its latency.

Which passes are counted changes the answer, so every function here takes ``passes``:

* ``"forward_backward"`` (the default, the course's convention): the totals of a
  training step. Compute per GPU is 6 P T (the 6N rule) plus 12 s h T (the attention
  scores, PaLM Appendix B), split over t GPUs; communication is four all-reduces of
  T h e bytes per layer (two forward, two backward; Megatron-LM, Section 3), a ring
  sending 2 (t-1)/t of each in 2 (t-1) messages. Summing the passes lets the backward's
  compute (twice the forward's) count against the forward's all-reduces, which in a real
  step sit on the forward's critical path.
* ``"forward"``: the forward pass alone, as "How to Scale Your Model" models it (Austin
  et al. 2025, Part 5 "How to Parallelize a Transformer for Training", section "Tensor
  Parallelism": "Let's only model the forward pass"): 2 P T + 4 s h T FLOPs against the
  two forward all-reduces. The forward has the fewest FLOPs per byte of the two passes,
  so if it covers its own collectives the backward does too: the stricter test.

In both, with k = 1 forward or 3 forward + backward and m = 2 or 4 all-reduces,

    t_c = k (2P + 4 s h) T / (t C),      t_m = 2 m (t-1) alpha + 2 m (t-1)/t T h e / W.

Sequence parallelism's all-gather + reduce-scatter pairs move the same bytes in the same
number of messages. (The closed forms below read their constants, 2 m h e bytes per
token and FSDP's 3 e bytes per parameter, off those volumes: :func:`tp_bytes_per_token`,
:func:`fsdp_bytes_per_param`.)

Compute covers communication while ``t_c >= t_m``; multiplying by t,

    k (2P + 4 s h) T / C  >=  (t - 1) (2 m t alpha + 2 m T h e / W).

The left side does not depend on t and the right side grows with it, so there is a
largest t that still pays: :func:`max_useful_tp`. On bandwidth alone (alpha = 0) the
tokens T cancel, and (:func:`bandwidth_bound_tp`)

    forward + backward:  t_max = 1 + (6P + 12 s h) W / (8 h e C)
    forward only:        t_max = 1 + (2P +  4 s h) W / (4 h e C)

Adding the backward triples the FLOPs and only doubles the bytes, so forward + backward
allows a larger t. For a GPT layer (P = 12 h², F = 4h), bf16 and s much smaller than 6h:
``t_max ~ 1 + (9/8) F W / C`` forward + backward, ``1 + (3/4) F W / C`` forward only.
Austin et al. find ``t < F W / C`` (:func:`mlp_forward_tp_bound`) from one MLP's
forward: two matmuls, 4 T h F FLOPs, against an all-gather and a reduce-scatter of T h e
bytes each, with (t-1)/t dropped. The whole layer's forward adds attention, which costs
half the MLP's FLOPs (8 h² against 16 h² per token) and a second all-reduce: a factor
3/4. Counting the backward multiplies by 3/2. That forward + backward lands near F W / C
(9/8 of it, plus 1) is these two factors cancelling, not one model agreeing with the
other. The batch matters only through the latency term: a small micro-batch sends small
messages, and alpha lowers t_max.

For an H100 (989 TFLOP/s dense bf16, the ``dgx-h100`` preset) and LLaMA-2 70B at
micro-batch 1 (:func:`max_useful_tp_on_h100`; ``tests/test_calc_tp_roofline.py`` pins
these numbers): NVLink 4 (450 GB/s) allows t up to 16 forward + backward (bandwidth
bound 20.2) and 12 forward only (13.8); InfiniBand NDR (50 GB/s per GPU) 3 (3.14) and 2
(2.42). The search counts any integer t: a DGX H100's NVLink domain is its 8 GPUs, so a
t above 8 crosses InfiniBand, and 70B's 8 key/value heads cap t at 8 as well (the
planner's rule, notebook 12). So for 70B the roofline does not limit TP inside a node
under either convention; across nodes it stops TP after 2 or 3 GPUs. That is why TP
stays inside the NVLink domain.

**TP and FSDP together** (:func:`tp_fsdp_comm`). N GPUs, TP over t of them and FSDP
(ZeRO-3) over the d = N/t groups; each GPU's share of the batch is b tokens, so a TP
group works on t b tokens. Per GPU and step, from the library's volumes:

* FSDP (:func:`distlab.calc.comm.fsdp_comm`): all-gather forward, all-gather backward,
  reduce-scatter of the gradients, each (d-1)/d of the GPU's P L / t parameters:
  ``~ 3 P L e / t`` bytes;
* TP (:func:`distlab.calc.comm.tensor_parallel_comm`): ``8 (t-1)/t (t b) h e L
  = 8 (t-1) b h e L`` bytes.

So ``V(t) ~ L e (3P/t + 8 (t-1) b h)`` for large d. TP of degree t sends less than
pure FSDP (t = 1) when ``3P (1 - 1/t) > 8 (t-1) b h``, that is when the per-GPU batch

    b < 3P / (8 h t)                                         (:func:`tp_fsdp_batch_bound`)

(for t = 2 and P = 12 h²: b < 9h/4 tokens per GPU). Setting dV/dt = 0 gives the best
split ``t* = sqrt(3P / (8 b h))`` (``sqrt(4.5 h / b)`` for a GPT layer):
:func:`best_tp_fsdp_split` searches the divisors of N with the exact volumes. Austin et
al. derive the same shape (FSDP's bytes fall as 1/t, TP's grow with t b, the best FSDP
degree grows as the square root of the batch) for the MLP alone. Bytes only: both
groups are assumed to use the same link; in practice TP sits on NVLink and FSDP
crosses the network, which :func:`distlab.calc.planner.plan` weighs.

**And the planner?** :mod:`distlab.calc.planner` minimises step time with TP
communication on the critical path, under a memory limit. Past max_useful_tp the layer
is communication-bound, so a larger tp only wins there when memory or the pipeline
bubble force it; ``tests/test_calc_tp_roofline.py`` checks that for the presets the
planner's tp stays within max_useful_tp of its own TP link, compute efficiency and
micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distlab.core.checks import choice, divisors, fraction, positive, positive_int

from ..sim.topology import IB_NDR, NVLINK4, PRESETS, Link
from .comm import fsdp_comm, tensor_parallel_comm
from .flops import attention_flops_per_token, training_flops_per_token
from .transformer import ModelSpec, model_preset
from .volume import CommVolume

#: H100 SXM dense bf16 peak, as the ``dgx-h100`` cluster preset states it
H100_PEAK_FLOPS = PRESETS["dgx-h100"].gpu_peak_flops
#: the two links a TP group of H100s can use: NVLink inside the node, InfiniBand across
H100_LINKS: dict[str, Link] = {"NVLink 4": NVLINK4, "InfiniBand NDR": IB_NDR}
#: what compute and communication are counted over (module docstring, "The roofline"):
#: the forward + backward of a training step (the course's convention) or the forward
#: pass alone (Austin et al. 2025, "How to Scale Your Model", Part 5, "Tensor Parallelism")
PASSES = ("forward_backward", "forward")


@dataclass(frozen=True)
class TPLayerTime:
    """One layer on one GPU of a TP group of ``tp``: seconds and sizes of the ``passes``
    counted (the forward + backward, or the forward alone)."""

    tp: int
    flops: float
    comm_bytes: float
    compute_s: float
    comm_s: float
    passes: str = "forward_backward"

    @property
    def comm_bound(self) -> bool:
        """True when the TP collectives take longer than the layer's matmuls."""
        return self.comm_s > self.compute_s

    @property
    def comm_to_compute(self) -> float:
        """Communication seconds per compute second (above 1: communication-bound)."""
        return self.comm_s / self.compute_s


def _spec(model: ModelSpec | str) -> ModelSpec:
    spec = model_preset(model) if isinstance(model, str) else model
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"model must be a ModelSpec or a preset name, got {model!r}")
    return spec


def _rate(peak_flops: float, compute_efficiency: float) -> float:
    """C: the FLOP/s one GPU sustains, ``peak_flops * compute_efficiency`` (0 < efficiency <= 1)."""
    efficiency = positive("compute_efficiency", fraction("compute_efficiency", compute_efficiency))
    return positive("peak_flops", peak_flops) * efficiency


def _passes(passes: str) -> str:
    return str(choice("passes", passes, PASSES))


def tp_volume(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    tp: int,
    passes: str = "forward_backward",
    sequence_parallel: bool = False,
    bytes_per_element: int = 2,
) -> CommVolume:
    """One layer's TP collectives for ``passes``: :func:`~distlab.calc.comm.tensor_parallel_comm`
    for one layer, all four all-reduces (``"forward_backward"``) or only its forward parts,
    the two all-reduces after attention and after the MLP (``"forward"``)."""
    volume = tensor_parallel_comm(
        seq_len=seq_len,
        micro_batch=micro_batch,
        hidden=hidden,
        layers=1,
        tp=tp,
        sequence_parallel=sequence_parallel,
        bytes_per_element=bytes_per_element,
    )
    if _passes(passes) == "forward_backward":
        return volume
    forward = tuple(part for part in volume.parts if part.what.startswith("forward"))
    return CommVolume(f"{volume.name}, forward", forward)


def tp_bytes_per_token(
    hidden: int, *, bytes_per_element: int = 2, passes: str = "forward_backward"
) -> float:
    """``8 h e`` (forward + backward) or ``4 h e`` (forward): the bytes one GPU sends per
    token and layer for its TP collectives, without the ring's ``(t-1)/t``:
    :func:`tp_volume` for one token at t = 2, where ``(t-1)/t = 1/2``, doubled. (The closed
    forms here take their constants from the library's volumes, so they follow any change
    of how those are counted.)"""
    at_two = tp_volume(
        seq_len=1,
        micro_batch=1,
        hidden=hidden,
        tp=2,
        passes=passes,
        bytes_per_element=bytes_per_element,
    )
    return 2 * at_two.total


def fsdp_bytes_per_param(*, bytes_per_element: int = 2) -> float:
    """``3 e``: the bytes one GPU sends per parameter it holds for FSDP's two all-gathers
    and one reduce-scatter, without ``(d-1)/d``: :func:`~distlab.calc.comm.fsdp_comm` of one
    parameter over d = 2, doubled."""
    return 2 * fsdp_comm(1, dp=2, bytes_per_param=bytes_per_element).total


def layer_flops_per_token(model: ModelSpec | str, *, passes: str = "forward_backward") -> float:
    """FLOPs of one layer per token. Forward + backward: 6 P + 12 s h
    (:func:`~distlab.calc.flops.training_flops_per_token` of the layer's parameters plus
    :func:`~distlab.calc.flops.attention_flops_per_token` for one layer); forward: a third
    of it, 2 P + 4 s h (the backward costs twice the forward; Kaplan et al. 2020, Section 2.1)."""
    spec = _spec(model)
    both = training_flops_per_token(spec.params_per_layer) + attention_flops_per_token(
        layers=1, hidden=spec.hidden, seq_len=spec.seq_len
    )
    return both if _passes(passes) == "forward_backward" else both / 3


def tp_layer_time(
    model: ModelSpec | str,
    *,
    tp: int,
    link: Link,
    peak_flops: float,
    micro_batch: int = 1,
    compute_efficiency: float = 1.0,
    sequence_parallel: bool = False,
    bytes_per_element: int = 2,
    passes: str = "forward_backward",
) -> TPLayerTime:
    """Compute and TP-communication seconds of one layer (module docstring, "The roofline").

    ``t_c`` = :func:`layer_flops_per_token` x b s / t over ``C = peak_flops *
    compute_efficiency``: ``(6P + 12 s h) b s / (t C)`` forward + backward, ``(2P + 4 s h)
    b s / (t C)`` forward; ``t_m`` = :func:`tp_volume` (four all-reduces, or the forward's
    two) timed on ``link`` (:meth:`~distlab.calc.volume.CommVolume.time_on`: messages x
    alpha + bytes / W).
    """
    spec = _spec(model)
    t = positive_int("tp", tp)
    b = positive_int("micro_batch", micro_batch)
    rate = _rate(peak_flops, compute_efficiency)
    flops = layer_flops_per_token(spec, passes=passes) * b * spec.seq_len / t
    volume = tp_volume(
        seq_len=spec.seq_len,
        micro_batch=b,
        hidden=spec.hidden,
        tp=t,
        passes=passes,
        sequence_parallel=sequence_parallel,
        bytes_per_element=bytes_per_element,
    )
    return TPLayerTime(t, flops, volume.total, flops / rate, volume.time_on(link), passes)


def max_useful_tp(
    model: ModelSpec | str,
    *,
    link: Link,
    peak_flops: float,
    micro_batch: int = 1,
    compute_efficiency: float = 1.0,
    bytes_per_element: int = 2,
    limit: int = 4096,
    passes: str = "forward_backward",
) -> int:
    """The largest t whose layer compute still covers its TP communication.

    Solves ``(6P + 12 s h) T / C >= (t-1)(8 t alpha + 8 T h e / W)`` forward + backward, or
    ``(2P + 4 s h) T / C >= (t-1)(4 t alpha + 4 T h e / W)`` forward only (module
    docstring), by stepping t up with :func:`tp_layer_time` until communication takes
    longer; the right side grows with t, so the first t that fails ends the search. Any
    integer t is counted: a real layout also needs t to divide the heads (and key/value
    heads) and to fit in one NVLink domain. Returns 1 when even t = 2 is
    communication-bound; raises if ``limit`` still pays.
    """
    last = positive_int("limit", limit)
    for t in range(2, last + 1):
        step = tp_layer_time(
            model,
            tp=t,
            link=link,
            peak_flops=peak_flops,
            micro_batch=micro_batch,
            compute_efficiency=compute_efficiency,
            bytes_per_element=bytes_per_element,
            passes=passes,
        )
        if step.comm_bound:
            return t - 1
    raise ValueError(f"every tp up to limit={last} still pays; raise the limit")


def bandwidth_bound_tp(
    model: ModelSpec | str,
    *,
    bandwidth: float,
    peak_flops: float,
    compute_efficiency: float = 1.0,
    bytes_per_element: int = 2,
    passes: str = "forward_backward",
) -> float:
    """The real-valued t at which compute equals TP communication when latency is ignored
    (module docstring): ``1 + (6P + 12 s h) W / (8 h e C)`` forward + backward (for a GPT
    layer ~ ``1 + (9/8) F W / C``), ``1 + (2P + 4 s h) W / (4 h e C)`` forward only
    (~ ``1 + (3/4) F W / C``). :func:`max_useful_tp` on a link with alpha = 0 is its floor."""
    spec = _spec(model)
    rate = _rate(peak_flops, compute_efficiency)
    comm = tp_bytes_per_token(spec.hidden, bytes_per_element=bytes_per_element, passes=passes)
    flops = layer_flops_per_token(spec, passes=passes)
    return 1 + flops * positive("bandwidth", bandwidth) / (comm * rate)


def mlp_forward_tp_bound(
    model: ModelSpec | str,
    *,
    bandwidth: float,
    peak_flops: float,
    compute_efficiency: float = 1.0,
    bytes_per_element: int = 2,
) -> float:
    """``2 F W / (e C)``, ``F W / C`` in bf16: the TP degree below which one MLP's forward is
    compute-bound in "How to Scale Your Model" (Austin et al. 2025, Part 5, section
    "Tensor Parallelism": ``Y < F / (C / W_ici)``). It counts the MLP's two matmuls,
    ``4 T h F / (t C)`` seconds, against an all-gather of its input and a reduce-scatter of
    its output, ``2 T h e / W``, and drops the ring's ``(t-1)/t``. F is the model's MLP
    inner size; a gated MLP (LLaMA) has a third matrix that the source's count leaves out.
    The source's W_ici is an axis's "bidirectional" ICI bandwidth (its Part 3), what a chip
    sends to its two ring neighbours together; here W is what one GPU sends, the library's
    per-direction link bandwidth. Compare :func:`bandwidth_bound_tp`, which counts the
    whole layer."""
    spec = _spec(model)
    rate = _rate(peak_flops, compute_efficiency)
    e = positive_int("bytes_per_element", bytes_per_element)
    return 2 * spec.ffn * positive("bandwidth", bandwidth) / (e * rate)


def max_useful_tp_on_h100(
    model: ModelSpec | str,
    *,
    micro_batch: int = 1,
    compute_efficiency: float = 1.0,
    passes: str = "forward_backward",
) -> dict[str, int]:
    """:func:`max_useful_tp` on an H100 (:data:`H100_PEAK_FLOPS`) over each of
    :data:`H100_LINKS`: ``{"NVLink 4": ..., "InfiniBand NDR": ...}``. Any integer t: a
    DGX H100 keeps NVLink to its 8 GPUs (module docstring)."""
    return {
        name: max_useful_tp(
            model,
            link=link,
            peak_flops=H100_PEAK_FLOPS,
            micro_batch=micro_batch,
            compute_efficiency=compute_efficiency,
            passes=passes,
        )
        for name, link in H100_LINKS.items()
    }


# ------------------------------------------------------------------ TP and FSDP together


@dataclass(frozen=True)
class TpFsdpComm:
    """Bytes one GPU sends per step with TP over ``tp`` GPUs and FSDP over ``fsdp`` groups."""

    tp: int
    fsdp: int
    tp_bytes: float
    fsdp_bytes: float

    @property
    def total(self) -> float:
        return self.tp_bytes + self.fsdp_bytes


def tp_fsdp_comm(
    model: ModelSpec | str,
    *,
    n_gpus: int,
    tp: int,
    tokens_per_gpu: int,
    bytes_per_element: int = 2,
) -> TpFsdpComm:
    """Per-GPU bytes of TP and of FSDP for the model's layers (module docstring).

    FSDP: :func:`~distlab.calc.comm.fsdp_comm` of the GPU's ``L P / tp`` parameters over
    ``n_gpus / tp`` ranks; TP: :func:`~distlab.calc.comm.tensor_parallel_comm` of the TP
    group's ``tp * tokens_per_gpu`` tokens over ``tp`` ranks. Embeddings are left out.
    """
    spec = _spec(model)
    n = positive_int("n_gpus", n_gpus)
    t = positive_int("tp", tp)
    if n % t:
        raise ValueError(f"tp={t} must divide n_gpus={n}")
    b = positive_int("tokens_per_gpu", tokens_per_gpu)
    d = n // t
    tp_bytes = tensor_parallel_comm(
        seq_len=t * b,
        micro_batch=1,
        hidden=spec.hidden,
        layers=spec.layers,
        tp=t,
        bytes_per_element=bytes_per_element,
    ).total
    fsdp_bytes = 0.0
    if d > 1:
        params = spec.layers * spec.params_per_layer / t
        fsdp_bytes = fsdp_comm(params, dp=d, bytes_per_param=bytes_per_element).total
    return TpFsdpComm(t, d, tp_bytes, fsdp_bytes)


def _fsdp_over_tp(spec: ModelSpec) -> float:
    """``3 P e / (8 h e) = 3P / (8h)``: a layer's FSDP bytes per GPU (t = 1, large d) over
    its TP bytes per token, from :func:`fsdp_bytes_per_param` and :func:`tp_bytes_per_token`
    (the ratio does not depend on e)."""
    return fsdp_bytes_per_param() * spec.params_per_layer / tp_bytes_per_token(spec.hidden)


def tp_fsdp_batch_bound(model: ModelSpec | str, *, tp: int = 2) -> float:
    """``3P / (8 h t)``: the tokens per GPU below which TP of degree ``tp`` mixed into FSDP
    sends fewer bytes than pure FSDP (large FSDP groups; module docstring)."""
    spec = _spec(model)
    t = positive_int("tp", tp)
    if t < 2:
        raise ValueError(f"tp must be >= 2 to mix TP into FSDP, got {tp!r}")
    return _fsdp_over_tp(spec) / t


def optimal_tp(model: ModelSpec | str, *, tokens_per_gpu: float) -> float:
    """``sqrt(3P / (8 b h))``: the real-valued TP degree that minimises TP + FSDP bytes
    per GPU for large FSDP groups (module docstring); :func:`best_tp_fsdp_split` rounds
    it to the best divisor with exact volumes."""
    spec = _spec(model)
    return math.sqrt(_fsdp_over_tp(spec) / positive("tokens_per_gpu", tokens_per_gpu))


def best_tp_fsdp_split(
    model: ModelSpec | str,
    *,
    n_gpus: int,
    tokens_per_gpu: int,
    max_tp: int | None = None,
    bytes_per_element: int = 2,
) -> TpFsdpComm:
    """The (tp, fsdp) split of ``n_gpus`` that sends the fewest bytes per GPU, over the
    divisors of ``n_gpus`` up to ``max_tp`` (e.g. the GPUs of one NVLink domain)."""
    n = positive_int("n_gpus", n_gpus)
    top = n if max_tp is None else positive_int("max_tp", max_tp)
    splits = [
        tp_fsdp_comm(
            model,
            n_gpus=n,
            tp=t,
            tokens_per_gpu=tokens_per_gpu,
            bytes_per_element=bytes_per_element,
        )
        for t in divisors(n)
        if t <= top
    ]
    return min(splits, key=lambda s: s.total)
