"""Training FLOPs, model FLOPs utilisation and step time.

Two ways of counting the FLOPs of a training step, both in use:

* the **6N rule** (Kaplan et al. 2020, "Scaling Laws for Neural Language
  Models", Section 2.1): a forward pass costs about 2N FLOPs per token (one
  multiply and one add per weight) and the backward twice that, so training
  costs 6N per token; GPT-3 (174.6B parameters, 300B tokens) took
  6 N D = 3.14e23 FLOPs (Brown et al. 2020, Table D.1).
* the **Megatron-LM formulas** for a GPT with l layers, hidden size h,
  sequence length s, vocabulary V and batch B, counting matmuls only:
  96 B s l h² (1 + s/(6h) + V/(16 l h)) FLOPs per step with full activation
  recomputation (the forward of every layer runs twice; the logit layer is
  not recomputed), the form Narayanan et al. 2021 use in Section 5.1 (derived
  in their appendix) as a lower bound; and the model FLOPs without
  recomputation, 72 B s l h² (1 + s/(6h) + V/(12 l h)) (Korthikanti et al.
  2022, "Reducing Activation Recomputation in Large Transformer Models",
  Appendix A).
  The s/(6h) term is attention's QK^T and attention-over-V matmuls, which
  the 6N rule leaves out.

MFU (model FLOPs utilisation; Chowdhery et al. 2022, "PaLM", Appendix B) is
the model FLOPs without recomputation divided by what the GPUs could do in
the step time; with the recomputed FLOPs it is HFU (hardware FLOPs utilisation).

Bytes moved, for the operations that FLOPs do not limit: an elementwise kernel
reads each input tensor and writes each output once, so a chain of them costs
the sum over kernels and a fused kernel only its outside inputs and outputs
(:func:`elementwise_traffic`). The roofline model (Williams, Waterman and
Patterson 2009, "Roofline: An Insightful Visual Performance Model for
Multicore Architectures", CACM 52(4), abstract) bounds a kernel's time by
max(FLOPs / peak FLOP/s, bytes / memory bandwidth) (:func:`roofline_time`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from distlab.core.checks import choice, fraction, positive, positive_int
from distlab.core.layout import RECOMPUTE_MODES


def training_flops_per_token(n_params: float) -> float:
    """6N: forward 2N + backward 4N FLOPs per token (Kaplan et al. 2020, Section 2.1)."""
    return 6 * positive("n_params", n_params)


def training_flops(n_params: float, tokens: float) -> float:
    """6 N D: FLOPs to train N parameters on D tokens."""
    return training_flops_per_token(n_params) * positive("tokens", tokens)


def attention_flops_per_token(*, layers: int, hidden: int, seq_len: int) -> float:
    """12 l h s: forward + backward FLOPs per token of the attention scores
    (QK^T and attention over V, 2 s h each per layer forward, times 3 for
    the backward); PaLM's Appendix B adds this to 6N, as Megatron's s/(6h) term does."""
    layer_count = positive_int("layers", layers)
    return 12 * layer_count * positive_int("hidden", hidden) * positive_int("seq_len", seq_len)


def model_flops_per_token(n_params: float, *, layers: int, hidden: int, seq_len: int) -> float:
    """6N + 12 l h s: the model FLOPs per token that MFU counts (PaLM, Appendix B)."""
    return training_flops_per_token(n_params) + attention_flops_per_token(
        layers=layers, hidden=hidden, seq_len=seq_len
    )


def megatron_flops_per_step(
    *, batch: int, seq_len: int, layers: int, hidden: int, vocab: int, recompute: str = "full"
) -> float:
    """FLOPs of one training step of a GPT, counting its matmuls.

    ``recompute="full"``: 96 B s l h² (1 + s/(6h) + V/(16 l h)), Narayanan et
    al. 2021's formula (Section 5.1, derived in their appendix; it recomputes
    every layer's forward). ``"none"``: 72 B s l h² (1 + s/(6h) + V/(12 l h)),
    the model FLOPs (Korthikanti et al. 2022, Appendix A). ``"selective"``
    adds to that one more forward of the attention core, 4 B s² h per layer
    (Korthikanti et al. 2022, Section 5).
    """
    b = positive_int("batch", batch)
    s = positive_int("seq_len", seq_len)
    n_layers = positive_int("layers", layers)
    h = positive_int("hidden", hidden)
    v = positive_int("vocab", vocab)
    choice("recompute", recompute, RECOMPUTE_MODES)
    if recompute == "full":
        return 96 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (16 * n_layers * h))
    flops = 72 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (12 * n_layers * h))
    if recompute == "selective":
        flops += 4 * b * s * s * h * n_layers
    return flops


def recompute_overhead(
    recompute: str, *, seq_len: int | None = None, hidden: int | None = None
) -> float:
    """Extra FLOPs of activation recomputation, as a fraction of the layers' model FLOPs.

    ``"full"``: the forward runs twice; forward = 1/3 of forward + backward,
    so 1/3 (33%), whatever the shape. ``"selective"``: one more forward of the
    attention core, 4 b s² h per layer against 72 b s h² (1 + s/(6h)):
    s / (18h + 3s); needs ``seq_len`` and ``hidden``. ``"none"``: 0.
    The logit layer (never recomputed) is left out of the denominator.
    """
    choice("recompute", recompute, RECOMPUTE_MODES)
    if recompute == "none":
        return 0.0
    if recompute == "full":
        return 1 / 3
    if seq_len is None or hidden is None:
        raise ValueError("recompute_overhead('selective') needs seq_len and hidden")
    s, h = positive_int("seq_len", seq_len), positive_int("hidden", hidden)
    return s / (18 * h + 3 * s)


def mfu(
    *, flops_per_step: float, step_time_s: float, n_gpus: int, peak_flops_per_gpu: float
) -> float:
    """Achieved FLOP/s over peak: flops_per_step / (step_time_s * n_gpus * peak).

    Pass model FLOPs (no recomputation) for MFU, hardware FLOPs for HFU.
    """
    achieved = positive("flops_per_step", flops_per_step) / positive("step_time_s", step_time_s)
    return achieved / (
        positive_int("n_gpus", n_gpus) * positive("peak_flops_per_gpu", peak_flops_per_gpu)
    )


def step_time(
    *, flops_per_step: float, n_gpus: int, peak_flops_per_gpu: float, mfu: float
) -> float:
    """Seconds per step if the GPUs sustain ``mfu`` of their peak:
    flops_per_step / (n_gpus * peak * mfu)."""
    utilisation = fraction("mfu", mfu)
    if utilisation == 0:
        raise ValueError("mfu must be > 0 to give a finite step time")
    return positive("flops_per_step", flops_per_step) / (
        positive_int("n_gpus", n_gpus)
        * positive("peak_flops_per_gpu", peak_flops_per_gpu)
        * utilisation
    )


def training_time(
    n_params: float, tokens: float, *, n_gpus: int, flops_per_gpu: float, recompute: bool = True
) -> float:
    """Seconds to train: 8 T P / (n X) with full recomputation, 6 T P / (n X) without.

    Narayanan et al. 2021, Section 5.1: T tokens, P parameters, n
    GPUs each sustaining X FLOP/s (achieved, not peak). GPT-3 175B on 300B
    tokens with 1024 A100s at 140 TFLOP/s: about 34 days.
    """
    factor = 8 if recompute else 6
    return (
        factor
        * positive("n_params", n_params)
        * positive("tokens", tokens)
        / (positive_int("n_gpus", n_gpus) * positive("flops_per_gpu", flops_per_gpu))
    )


@dataclass(frozen=True)
class Traffic:
    """Memory traffic of a sequence of kernels, in bytes."""

    read_bytes: float
    written_bytes: float
    kernels: int

    @property
    def total(self) -> float:
        return self.read_bytes + self.written_bytes


def elementwise_traffic(
    numel: int, kernels: Sequence[tuple[int, int]], *, bytes_per_element: int = 4
) -> Traffic:
    """Bytes an elementwise chain moves between memory and the cores.

    ``kernels`` lists, for each kernel launched, how many tensors of ``numel``
    elements it reads and how many it writes (scalars are free). Unfused,
    ``c = relu(a * b)`` is ``[(2, 1), (1, 1)]``: 5 tensor passes; fused into one
    kernel it is ``[(2, 1)]``: 3, the intermediate ``a * b`` staying in registers.
    Bytes = sum over kernels of (reads + writes) x numel x bytes_per_element,
    assuming no tensor is still in cache when the next kernel reads it.
    """
    n = positive_int("numel", numel)
    size = positive_int("bytes_per_element", bytes_per_element)
    if not kernels:
        raise ValueError("kernels must list at least one (reads, writes) pair, got none")
    for pair in kernels:
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(isinstance(k, int) and k >= 0 for k in pair)
        ):
            raise ValueError(
                f"each kernel must be a (reads, writes) pair of integers >= 0, got {pair!r}"
            )
    reads = sum(r for r, _ in kernels)
    writes = sum(w for _, w in kernels)
    return Traffic(reads * n * size, writes * n * size, len(kernels))


def arithmetic_intensity(*, flops: float, n_bytes: float) -> float:
    """FLOPs per byte moved: flops / n_bytes (Williams et al. 2009, abstract)."""
    return positive("flops", flops) / positive("n_bytes", n_bytes)


def ridge_point(*, peak_flops: float, bandwidth: float) -> float:
    """peak FLOP/s / memory bytes/s: the arithmetic intensity above which a kernel
    can be compute-bound (Williams et al. 2009, abstract); below it, memory-bound."""
    return positive("peak_flops", peak_flops) / positive("bandwidth", bandwidth)


def roofline_time(*, flops: float, n_bytes: float, peak_flops: float, bandwidth: float) -> float:
    """Lower bound on a kernel's seconds: max(flops / peak_flops, n_bytes / bandwidth)
    (the roofline model, Williams et al. 2009, abstract). ``flops`` may be 0 (a pure copy)."""
    if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not flops >= 0:
        raise ValueError(f"flops must be a number >= 0, got {flops!r}")
    return max(
        flops / positive("peak_flops", peak_flops),
        positive("n_bytes", n_bytes) / positive("bandwidth", bandwidth),
    )


def run_seconds(tokens: float, *, tokens_per_step: float, step_s: float) -> float:
    """Wall-clock seconds to train on ``tokens``: ceil(tokens / tokens_per_step) steps of
    ``step_s`` each (no failures, restarts or checkpoint stalls counted). With the step time
    at an achieved MFU this agrees with :func:`training_time`'s 6TP/(nX) up to the
    attention FLOPs that 6N leaves out."""
    steps = math.ceil(positive("tokens", tokens) / positive("tokens_per_step", tokens_per_step))
    return steps * positive("step_s", step_s)
