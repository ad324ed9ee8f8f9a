"""SyncBatchNorm on 4 ranks with 2 samples each equals BatchNorm on the whole batch of 8;
plain per-rank BatchNorm does not."""

from __future__ import annotations

import pytest
import torch

import distlab

RANKS, PER_RANK, CHANNELS, LENGTH = 4, 2, 3, 5


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(RANKS * PER_RANK, CHANNELS, LENGTH, generator=g) * 3 + 1
    weights = torch.randn(RANKS * PER_RANK, CHANNELS, LENGTH, generator=g)
    return x, weights


def _loss(y, weights):
    return (y * weights).sum() / y.shape[0]  # mean over samples


def _worker(rank, world_size):
    import torch
    from torch import nn

    torch.set_num_threads(1)
    from distlab.parallel import Collectives, SyncBatchNorm, shard_batch

    x, weights = _data()
    local_x, local_w = shard_batch((x, weights), rank, world_size)
    out = {}
    for name, bn in [("sync", SyncBatchNorm(CHANNELS)), ("per-rank", nn.BatchNorm1d(CHANNELS))]:
        with torch.no_grad():
            bn.weight.copy_(torch.linspace(0.5, 1.5, CHANNELS))
            bn.bias.copy_(torch.linspace(-1, 1, CHANNELS))
        xr = local_x.clone().requires_grad_()
        y = bn(xr)
        _loss(y, local_w).backward()
        comm = Collectives("ring")
        weight_grad = bn.weight.grad.clone()
        comm.all_reduce_mean_(weight_grad)  # what data parallelism does with it
        out[name] = {
            "y": y.detach(),
            "dx": xr.grad,
            "weight_grad": weight_grad,
            "running_mean": bn.running_mean.clone(),
            "running_var": bn.running_var.clone(),
        }
    return out


@pytest.fixture(scope="module")
def results():
    return distlab.run(_worker, RANKS, timeout=120)


def _full_batch():
    x, weights = _data()
    bn = torch.nn.BatchNorm1d(CHANNELS)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, CHANNELS))
        bn.bias.copy_(torch.linspace(-1, 1, CHANNELS))
    x = x.clone().requires_grad_()
    y = bn(x)
    _loss(y, weights).backward()
    return bn, x, y


def test_sync_batchnorm_equals_batchnorm_on_the_whole_batch(results):
    from distlab.parallel import shard_batch

    bn, x, y = _full_batch()
    for rank, result in enumerate(results):
        sync = result["sync"]
        torch.testing.assert_close(sync["y"], shard_batch(y.detach(), rank, RANKS))
        # each rank's loss is a mean over its 2 samples; the full loss a mean over 8 = 1/K of the sum
        torch.testing.assert_close(sync["dx"] / RANKS, shard_batch(x.grad, rank, RANKS))
        torch.testing.assert_close(sync["weight_grad"], bn.weight.grad)
        torch.testing.assert_close(sync["running_mean"], bn.running_mean)
        torch.testing.assert_close(sync["running_var"], bn.running_var)


def test_per_rank_batchnorm_normalises_with_tiny_noisy_batches(results):
    from distlab.parallel import shard_batch

    _, _, y = _full_batch()
    for rank, result in enumerate(results):
        per_rank = result["per-rank"]
        assert (per_rank["y"] - shard_batch(y.detach(), rank, RANKS)).abs().max() > 0.1
    means = [r["per-rank"]["running_mean"] for r in results]
    assert any(not torch.allclose(means[0], m) for m in means[1:])  # replicas drift apart
