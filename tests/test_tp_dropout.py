"""Dropout under tensor parallelism on 2 gloo ranks against the dense block with dropout.

A ``ParallelBlock`` with an ``RNGTracker`` must equal the dense ``GPTBlock``
whose masks are reproduced from the same seeds (``tensor_parallel_masks``:
each rank's heads from its own stream, the residual branches from the shared
one; with sequence parallelism each rank's tokens from its own stream):
output, input gradient and every weight gradient, also with selective
recomputation (the recomputed mask must be the forward's). Without the
tracker the two bugs show: one seed everywhere gives every rank's heads the
same mask (equal to the dense model with one mask repeated, not to the right
one); a seed per rank makes the replicated residual stream differ between ranks.
"""

from __future__ import annotations

import functools

import pytest
import torch
from gpt_blocks import Block

import distlab
from distlab.parallel.tensor.layers import block_shard
from distlab.parallel.tensor.rng import RNGTracker, block_with_masks, tensor_parallel_masks

HIDDEN, HEADS, SEQ, BATCH, P, SEED, T = 32, 4, 8, 2, 0.25, 11, 2
#: name -> (sequence_parallel, recompute_attention, seeding): "tracker", "same", "per rank"
RUNS = {
    "tracker": (False, False, "tracker"),
    "tracker, SP": (True, False, "tracker"),
    "tracker, recompute": (False, True, "tracker"),
    "one seed, no tracker": (False, False, "same"),
    "seed per rank, no tracker": (False, False, "per rank"),
}
BLOCK = Block(HIDDEN, HEADS, SEQ, BATCH, seed=0, data_seed=3, dropout=P)


def _worker(rank, world_size):
    torch.set_num_threads(1)
    from distlab.parallel.tensor import ParallelBlock, TensorParallelComm
    from distlab.parallel.tensor.sequence import sync_sequence_parallel_grads

    out = {}
    for name, (sequence_parallel, recompute, seeding) in RUNS.items():
        comm = TensorParallelComm(algorithm="ring")
        rng = RNGTracker(SEED, comm.rank) if seeding == "tracker" else None
        layer = ParallelBlock(
            BLOCK.make(),
            comm,
            sequence_parallel=sequence_parallel,
            recompute_attention=recompute,
            rng=rng,
        ).train()
        x, grad = BLOCK.inputs()
        if sequence_parallel:
            x, grad = x.chunk(world_size, 1)[rank], grad.chunk(world_size, 1)[rank]
        x = x.clone().requires_grad_()
        torch.manual_seed(SEED + rank if seeding == "per rank" else SEED)
        y = layer(x)
        y.backward(grad)
        if sequence_parallel:
            sync_sequence_parallel_grads(layer, comm)
        out[name] = {
            "y": y.detach(),
            "x_grad": x.grad,
            "grads": {n: p.grad for n, p in layer.named_parameters()},
        }
    return out


@functools.cache
def results():
    return distlab.run(_worker, T, timeout=120, show_output=False)


def dense(tracker: bool, sequence_parallel: bool = False):
    block = BLOCK.make()
    masks = tensor_parallel_masks(
        block, BATCH, SEQ, tp=T, seed=SEED, tracker=tracker, sequence_parallel=sequence_parallel
    )
    x, grad = BLOCK.inputs()
    x.requires_grad_()
    y = block_with_masks(block, x, masks)
    y.backward(grad)
    return block, y.detach(), x.grad


@pytest.mark.parametrize("name", ["tracker", "tracker, SP", "tracker, recompute"])
def test_tracked_dropout_equals_the_dense_block_with_the_same_masks(name):
    sequence_parallel = RUNS[name][0]
    block, y, x_grad = dense(tracker=True, sequence_parallel=sequence_parallel)
    for rank, res in enumerate(results()):
        got = res[name]
        if sequence_parallel:
            y_r, x_grad_r = y.chunk(T, 1)[rank], x_grad.chunk(T, 1)[rank]
        else:
            y_r, x_grad_r = y, x_grad
        torch.testing.assert_close(got["y"], y_r)
        torch.testing.assert_close(got["x_grad"], x_grad_r)
        for param_name, p in block.named_parameters():
            want = block_shard(param_name, p.grad, T, rank)
            torch.testing.assert_close(got["grads"][param_name], want, msg=param_name)


def test_one_seed_everywhere_repeats_the_mask_over_the_ranks_heads():
    _, right, _ = dense(tracker=True)
    _, repeated, _ = dense(tracker=False)
    for res in results():
        got = res["one seed, no tracker"]["y"]
        torch.testing.assert_close(got, repeated)  # what it computes: one mask for all ranks
        assert (got - right).abs().max() > 1e-2  # not the dense model with independent masks


def test_a_seed_per_rank_without_the_tracker_splits_the_residual_stream():
    rank0, rank1 = (res["seed per rank, no tracker"]["y"] for res in results())
    assert (rank0 - rank1).abs().max() > 1e-2
    tracked0, tracked1 = (res["tracker"]["y"] for res in results())
    torch.testing.assert_close(tracked0, tracked1, rtol=0, atol=0)


def test_the_tracker_keeps_the_default_stream_and_continues_its_own():
    torch.manual_seed(5)
    expected = torch.rand(3)
    tracker = RNGTracker(5, 1)
    tracker.seed_default()
    with tracker.fork():
        first = torch.rand(2)
    got = torch.rand(3)
    with tracker.fork():
        second = torch.rand(2)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5 + 2718 + 1)
        torch.testing.assert_close(torch.cat([first, second]), torch.rand(4), rtol=0, atol=0)
