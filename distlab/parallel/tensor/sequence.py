"""Sequence parallelism: the LayerNorm and dropout regions split along the sequence.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", Section 4.2.2, Figure 5). Tensor parallelism leaves
LayerNorm, dropout and the residual adds replicated on every rank, 10sbh
bytes of activations per layer that do not shrink with t. Sequence
parallelism splits those regions along the sequence (each rank keeps s/t
tokens) and swaps each all-reduce for its two halves::

    LN, dropout on s/t tokens ──g──► column layer ... row layer ──ḡ──► s/t tokens
    g : all-gather forward,     reduce-scatter backward
    ḡ : reduce-scatter forward, all-gather backward

A ring all-reduce *is* a reduce-scatter then an all-gather, so the bytes on
the wire are the same (Section 4.2.2), while every activation is now
divided by t: sbh/t (34 + 5as/h) bytes per layer (Table 2).

One more trick, Megatron-LM's (``LinearWithGradAccumulationAndAsyncCommunication``):
the column layer saves its *sharded* input for backward, not the gathered
one, and all-gathers it again in backward to compute the weight gradient.
That keeps the LayerNorm outputs at 2sbh/t as Table 2 counts them, at the
price of one extra all-gather per column layer in backward.

Tensors here are ``(batch, seq, hidden)``; the sequence is dimension 1.
Parameters whose gradient each rank only sees a part of (LayerNorms, the
row layers' biases, position embeddings) are marked ``sequence_parallel``;
:func:`sync_sequence_parallel_grads` sums their gradients after backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops import (
    TensorParallelComm,
    all_gather,
    all_reduce,
    my_slice,
    reduce_scatter,
)

SEQ = 1  # the sequence dimension of (batch, seq, hidden)


class ScatterToSequenceParallel(torch.autograd.Function):
    """Keep this rank's s/t tokens forward; all-gather the gradient backward.
    Enters the sequence-parallel region from a replicated tensor."""

    @staticmethod
    def forward(ctx, x, comm: TensorParallelComm, where: str):
        ctx.comm, ctx.where = comm, where
        return my_slice(x, SEQ, comm)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, SEQ, ctx.comm, "backward", ctx.where), None, None


class GatherFromSequenceParallel(torch.autograd.Function):
    """g of Korthikanti et al. 2022, Section 4.2.2: all-gather the sequence
    forward, reduce-scatter the gradient backward."""

    @staticmethod
    def forward(ctx, x, comm: TensorParallelComm, where: str):
        ctx.comm, ctx.where = comm, where
        return all_gather(x, SEQ, comm, "forward", where)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, SEQ, ctx.comm, "backward", ctx.where), None, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """ḡ of Korthikanti et al. 2022, Section 4.2.2: reduce-scatter the partial
    sums of a row-parallel layer forward, all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, comm: TensorParallelComm, where: str):
        ctx.comm, ctx.where = comm, where
        return reduce_scatter(x, SEQ, comm, "forward", where)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, SEQ, ctx.comm, "backward", ctx.where), None, None


class LinearsOnGatheredSequence(torch.autograd.Function):
    """Y_j = all_gather(X) W_j^T + b_j for one or more column-parallel linears
    sharing an input (q, k, v), saving only this rank's shard of X.

    Forward: all-gather X along the sequence (g). Backward: all-gather X again
    for dW_j = dY_j^T X, and reduce-scatter dX = sum_j dY_j W_j (g's backward).
    Megatron-LM's memory-saving form of Korthikanti et al.'s column layer.
    ``params`` is ``weight_1, bias_1, weight_2, bias_2, ...`` (a bias may be None).
    """

    @staticmethod
    def forward(ctx, x_shard, comm: TensorParallelComm, where: str, *params):
        ctx.comm, ctx.where = comm, where
        ctx.has_bias = [b is not None for b in params[1::2]]
        ctx.save_for_backward(x_shard, *(w for w in params[0::2]))
        x = all_gather(x_shard, SEQ, comm, "forward", where)
        return tuple(F.linear(x, w, b) for w, b in zip(params[0::2], params[1::2], strict=True))

    @staticmethod
    def backward(ctx, *grads):
        x_shard, *weights = ctx.saved_tensors
        x = all_gather(x_shard, SEQ, ctx.comm, "backward", ctx.where + " (re-gather)")
        grad_x = sum(g @ w for g, w in zip(grads, weights, strict=True))
        grad_x = reduce_scatter(grad_x, SEQ, ctx.comm, "backward", ctx.where)
        param_grads = []
        for g, has_bias in zip(grads, ctx.has_bias, strict=True):
            param_grads.append(g.flatten(0, -2).T @ x.flatten(0, -2))
            param_grads.append(g.flatten(0, -2).sum(0) if has_bias else None)
        return grad_x, None, None, *param_grads


def scatter_to_sp(x, comm, where="enter sequence parallel"):
    return ScatterToSequenceParallel.apply(x, comm, where)


def gather_from_sp(x, comm, where="gather sequence"):
    return GatherFromSequenceParallel.apply(x, comm, where)


def reduce_scatter_to_sp(x, comm, where="output"):
    return ReduceScatterToSequenceParallel.apply(x, comm, where)


def linears_on_gathered_sequence(x_shard, linears, comm, where="input"):
    """Apply ``linears`` (modules with ``weight``, ``bias``) to the gathered ``x_shard``."""
    params = [p for layer in linears for p in (layer.weight, layer.bias)]
    return LinearsOnGatheredSequence.apply(x_shard, comm, where, *params)


def mark_sequence_parallel(module: torch.nn.Module) -> None:
    """Mark every parameter of ``module``: its gradient is a per-rank partial sum."""
    for p in module.parameters():
        p.sequence_parallel = True


def sync_sequence_parallel_grads(module: torch.nn.Module, comm: TensorParallelComm) -> None:
    """After backward: sum the gradients of parameters marked ``sequence_parallel``
    over the group (each rank saw only its s/t tokens). Megatron-LM does this in
    ``finalize_model_grads``. One all-reduce of all of them, flattened."""
    grads = [
        p.grad
        for p in module.parameters()
        if getattr(p, "sequence_parallel", False) and p.grad is not None
    ]
    if not grads:
        return
    flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]), comm, "backward", "SP grads")
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))
