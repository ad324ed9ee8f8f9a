"""Communication volume per GPU per training step of each parallelism, as textbooks count it.

* data parallelism, ZeRO stages 0-3 and FSDP (Rajbhandari et al. 2020, Section 7):
  :func:`data_parallel_comm`, :func:`ddp_bytes_per_gpu`, :func:`fsdp_comm`;
* Megatron tensor (and sequence) parallelism: :func:`tensor_parallel_comm`, and the
  vocabulary-parallel embedding, head and loss: :func:`vocab_parallel_comm`;
* pipeline parallelism: :func:`pipeline_parallel_comm`;
* context parallelism: ring attention :func:`context_parallel_comm`, the K/V
  all-gather (Llama 3) :func:`context_parallel_gather_comm`, all-to-all
  (DeepSpeed-Ulysses) :func:`ulysses_comm`, and the K/V each holds at once,
  :func:`context_parallel_kv_bytes`.

Each returns a :class:`~distlab.calc.volume.CommVolume` of
:class:`~distlab.calc.volume.CommPart` s, counted as ring algorithms move the
bytes (:mod:`distlab.calc.volume` states the rules; ``.total`` is bytes sent per
GPU, ``.zero_paper_bytes`` the ZeRO paper's convention, ``.time_on(link)`` the
alpha-beta time). Expert parallelism is :mod:`distlab.calc.moe`, the buckets DDP
and ZeRO cut :mod:`distlab.calc.buckets`, and distlab's own TP x PP x DP run
:mod:`distlab.calc.three_d`.
"""

from __future__ import annotations

from distlab.core.checks import choice, positive, positive_int
from distlab.core.layout import ZERO_STAGES

from .volume import (
    AllToAllPart,
    CommPart,
    CommVolume,
)

_RECOMPUTE = ("none", "selective", "full")
#: the ways attention reaches the other ranks' tokens under context parallelism
CP_METHODS = ("ring", "all_gather", "ulysses")


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
    choice("zero_stage", zero_stage, ZERO_STAGES)
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
    m (v-1) activations; :func:`distlab.calc.three_d.three_d_comm`).
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


def context_parallel_comm(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers: int,
    cp: int,
    micro_batches: int = 1,
    bytes_per_element: int = 2,
    keeps_blocks: bool = False,
) -> CommVolume:
    """Ring attention's point-to-point traffic for ``layers`` layers over ``cp`` ranks.

    ``seq_len`` is the tokens one rank holds (the sequence divided by cp). Each
    layer passes its K and V blocks (``2 b s h`` elements; full multi-head K and V,
    no grouped-query sharing) to the next rank of the ring ``cp - 1`` times in the
    forward and sends their gradients home, ``cp - 1`` messages, in the backward.

    Which ring (``keeps_blocks``):

    * ``False`` (the default): a fused ring that keeps only its own K/V block for
      backward and holds two at a time, as the released code of Liu et al. 2023 ("Ring
      Attention with Blockwise Transformers", ``ringattention/ringattention_jax.py``)
      does. Its backward passes K and V round again, a third pass: ``3 (cp-1)`` messages
      per layer and micro-batch.
    * ``True``: a ring that keeps every block it receives for backward, as distlab's
      :mod:`distlab.parallel.context.ring` does (plain autograd): no second pass of K/V,
      ``2 (cp-1)`` messages, the bytes of :func:`context_parallel_gather_comm`.

    Convention: each pass counts the ``cp - 1`` hops a block needs to visit every rank.
    Liu et al.'s JAX code (``ringattention_jax.py``) rotates ``cp`` times per pass, the
    last rotation bringing each block home: ``cp / (cp - 1)`` times these bytes. Per
    step: ``micro_batches`` x ``layers`` x the messages of one layer and micro-batch.
    """
    c = positive_int("cp", cp)
    if c == 1:
        return CommVolume("context parallel", ())
    kv = _local_kv_bytes(seq_len, micro_batch, hidden, bytes_per_element)
    hops = (c - 1) * positive_int("layers", layers) * positive_int("micro_batches", micro_batches)
    again = () if keeps_blocks else (
        CommPart("backward K/V blocks to next rank", "send_recv", c, kv, hops),
    )  # fmt: skip
    return CommVolume(
        "context parallel",
        (
            CommPart("forward K/V blocks to next rank", "send_recv", c, kv, hops),
            *again,
            CommPart("backward K/V gradients to next rank", "send_recv", c, kv, hops),
        ),
    )


def _local_kv_bytes(seq_len: int, micro_batch: int, hidden: int, bytes_per_element: int) -> int:
    """``2 b s h`` elements: the K and V of the ``seq_len`` tokens one rank holds."""
    return (
        2
        * positive_int("seq_len", seq_len)
        * positive_int("micro_batch", micro_batch)
        * positive_int("hidden", hidden)
        * positive_int("bytes_per_element", bytes_per_element)
    )


def context_parallel_gather_comm(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers: int,
    cp: int,
    micro_batches: int = 1,
    bytes_per_element: int = 2,
) -> CommVolume:
    """All-gather context parallelism's traffic (Llama 3; :mod:`distlab.parallel.context.gather`).

    ``seq_len`` is the tokens one rank holds, as in :func:`context_parallel_comm`.
    Each layer all-gathers every rank's K and V (a buffer of ``cp x 2 b s h``
    elements) once in the forward and reduce-scatters their gradients once in the
    backward (the gathered K/V are kept for backward, not gathered again): each
    rank sends ``(cp-1) 2 b s h`` elements per collective, the bytes ring
    attention sends hop by hop. Per step: ``micro_batches`` x ``layers`` x those.
    """
    c = positive_int("cp", cp)
    kv = _local_kv_bytes(seq_len, micro_batch, hidden, bytes_per_element)
    if c == 1:
        return CommVolume("context parallel, all-gather", ())
    calls = positive_int("layers", layers) * positive_int("micro_batches", micro_batches)
    return CommVolume(
        "context parallel, all-gather",
        (
            CommPart("forward K/V all-gather", "all_gather", c, c * kv, calls),
            CommPart("backward K/V gradient reduce-scatter", "reduce_scatter", c, c * kv, calls),
        ),
    )


def ulysses_comm(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers: int,
    cp: int,
    micro_batches: int = 1,
    bytes_per_element: int = 2,
) -> CommVolume:
    """DeepSpeed-Ulysses' all-to-all traffic (Jacobs et al. 2023, Section 3.2;
    :mod:`distlab.parallel.context.ulysses`).

    ``seq_len`` is the tokens one rank holds. Each layer runs four all-to-alls in
    the forward (Q, K and V to head groups, the output back to tokens) and four in
    the backward (their gradients), each on the ``b s h`` elements a rank holds, of
    which it sends ``(cp-1)/cp``: per rank ``8 (cp-1)/cp b s h`` elements per
    layer, constant when the whole sequence and ``cp`` grow together. Per step:
    ``micro_batches`` x ``layers`` x those.
    """
    c = positive_int("cp", cp)
    payload = _local_kv_bytes(seq_len, micro_batch, hidden, bytes_per_element) // 2
    if c == 1:
        return CommVolume("context parallel, Ulysses", ())
    calls = 4 * positive_int("layers", layers) * positive_int("micro_batches", micro_batches)
    return CommVolume(
        "context parallel, Ulysses",
        (
            AllToAllPart("forward Q, K, V to heads and output to tokens", c, payload, calls),
            AllToAllPart("backward gradients of the same", c, payload, calls),
        ),
    )


def context_parallel_kv_bytes(
    method: str, *, seq_len: int, micro_batch: int, hidden: int, cp: int, bytes_per_element: int = 2
) -> int:
    """K/V bytes one rank holds at once while one layer's attention runs forward.

    ``seq_len`` is the tokens one rank holds, ``kv = 2 b s h`` elements its K and V:

    * ``"ring"``: the block in hand and the one arriving, ``2 kv`` (``kv`` if cp = 1);
    * ``"all_gather"``: every rank's block, ``cp kv`` (the own block gathered in place);
    * ``"ulysses"``: its ``h/cp`` head features of all ``cp s`` tokens, ``kv``.

    Activations saved for backward are another matter: distlab's ring and
    all-gather both keep every K/V block for backward (autograd), while a
    fused ring kernel recomputes instead and passes the blocks round again.
    """
    choice("method", method, CP_METHODS)
    c = positive_int("cp", cp)
    kv = _local_kv_bytes(seq_len, micro_batch, hidden, bytes_per_element)
    if method == "ring":
        return kv * min(c, 2)
    return kv * c if method == "all_gather" else kv
