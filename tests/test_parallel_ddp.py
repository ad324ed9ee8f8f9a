"""DDP's pieces: the data split, accumulation and no_sync, broadcasting, the overlap trace."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import distlab
from distlab.parallel import (
    ShardSampler,
    accumulate_gradients,
    gradient_scale_error,
    shard_batch,
    shard_indices,
)
from distlab.parallel.data.training import mse_loss

matplotlib.use("Agg")


# ------------------------------------------------------------- data split ----
@pytest.mark.parametrize("n, k", [(10, 1), (10, 3), (12, 4), (2, 4), (7, 2)])
def test_shards_cover_the_data_without_overlap(n, k):
    shards = [shard_indices(n, r, k, shuffle=True, seed=3) for r in range(k)]
    assert len({len(s) for s in shards}) == 1  # equal sizes: padding repeats a few samples
    everything = [i for s in shards for i in s]
    assert set(everything) == set(range(n))
    assert len(everything) - n == -n % k  # exactly the padding, nothing else repeats
    dropped = [shard_indices(n, r, k, drop_last=True) for r in range(k)]
    flat = [i for s in dropped for i in s]
    assert len(flat) == len(set(flat)) == n - n % k


def test_the_epoch_changes_the_order_and_ranks_agree_on_it():
    a = shard_indices(20, 0, 2, shuffle=True, epoch=0)
    b = shard_indices(20, 0, 2, shuffle=True, epoch=1)
    assert a != b
    other = shard_indices(20, 1, 2, shuffle=True, epoch=1)
    assert not set(b) & set(other)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_split_is_torch_distributed_sampler(shuffle, drop_last):
    from torch.utils.data import DistributedSampler

    for n in (0, 1, 5, 7, 12):
        for k in (1, 2, 3, 4):
            for rank in range(k):
                sampler = DistributedSampler(
                    range(n),
                    num_replicas=k,
                    rank=rank,
                    shuffle=shuffle,
                    seed=5,
                    drop_last=drop_last,
                )
                sampler.set_epoch(3)
                ours = shard_indices(
                    n, rank, k, shuffle=shuffle, seed=5, epoch=3, drop_last=drop_last
                )
                assert ours == list(sampler), (n, k, rank)
                loader_sampler = ShardSampler(
                    n, rank, k, shuffle=shuffle, seed=5, drop_last=drop_last
                )
                loader_sampler.set_epoch(3)
                assert list(loader_sampler) == ours and len(loader_sampler) == len(sampler)


def test_bad_split_arguments_are_named():
    with pytest.raises(ValueError, match="rank must be in"):
        shard_indices(10, 2, 2)
    with pytest.raises(ValueError, match="does not divide by world_size 4"):
        shard_batch(torch.zeros(6, 2), 0, 4)


# ---------------------------------------------------------------- buckets ----
def test_buckets_are_cut_like_pytorch_ddp():
    """Same rule as torch.distributed._compute_bucket_assignment_by_size with one cap,
    on the parameters in gradient-ready (reverse) order, from one bucket per tensor
    to one bucket for the whole model."""
    import torch.distributed as dist

    from distlab.models import GPT, MLP, GPTConfig
    from distlab.parallel.comm.buckets import assign_buckets, trainable_parameters

    for model in (MLP(seed=0), GPT(GPTConfig(), seed=0)):
        params = trainable_parameters(model)[::-1]
        index = {id(p): i for i, p in enumerate(params)}
        counts = []
        for cap in (1, 500, 4096, 20_000, 10**9):
            ours = [[index[id(p)] for p in bucket] for bucket in assign_buckets(params, cap)]
            theirs, _ = dist._compute_bucket_assignment_by_size(
                params, [cap], [False] * len(params)
            )
            assert ours == theirs, (type(model).__name__, cap)
            counts.append(len(ours))
        assert counts[0] == len(params) and counts[-1] == 1


def test_bucket_cap_is_counted_in_mib_like_ddp():
    from distlab.parallel.comm.buckets import DEFAULT_BUCKET_CAP_MB, bucket_cap_bytes

    assert DEFAULT_BUCKET_CAP_MB == 25
    assert bucket_cap_bytes(25) == 25 * 1024 * 1024
    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0"):
        bucket_cap_bytes(0)
    with pytest.raises(TypeError, match="bucket_cap_mb must be a number"):
        bucket_cap_bytes("25")


# ----------------------------------------------------------- accumulation ----
def _grads_of(micro: int, scale: bool) -> list[torch.Tensor]:
    from distlab.models import MLP, mlp_batch

    model = MLP(seed=0)
    x, y = mlp_batch(12, seed=1)
    batches = list(zip(x.chunk(micro), y.chunk(micro)))
    accumulate_gradients(model, mse_loss, batches, scale_loss=scale)
    return [p.grad.clone() for p in model.parameters()]


def test_accumulation_with_scaled_loss_gives_the_full_batch_gradient():
    full = _grads_of(1, True)
    for got, want in zip(_grads_of(4, True), full):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert gradient_scale_error(_grads_of(4, True), full) == pytest.approx(1.0, rel=1e-6)


def test_forgetting_to_divide_the_loss_makes_gradients_k_times_too_large():
    full = _grads_of(1, True)
    for k in (2, 3, 4):
        assert gradient_scale_error(_grads_of(k, False), full) == pytest.approx(k, rel=1e-5)


# ------------------------------------------------------ on real processes ----
def _ddp_worker(rank, world_size):
    import torch
    from torch import nn

    torch.set_num_threads(1)
    from distlab.models import MLP, mlp_batch
    from distlab.parallel import BucketedDDP, NaiveDDP, accumulate_gradients, gradient_scale_error
    from distlab.parallel import shard_batch as shard
    from distlab.parallel.data.training import mse_loss as loss_fn

    out = {}
    # 1. Construction broadcasts rank 0's parameters and buffers.
    for cls in (NaiveDDP, BucketedDDP):
        model = nn.Sequential(MLP(seed=rank), nn.BatchNorm1d(8))
        model[1].running_mean.fill_(float(rank))
        cls(model)
        out[cls.__name__ + " state"] = {k: v.clone() for k, v in model.state_dict().items()}

    # 1b. Every training forward broadcasts rank 0's buffers (BatchNorm running stats);
    # not under no_grad (rank 0 may evaluate alone), not inside no_sync, not when turned off.
    data = torch.randn(6, 16, generator=torch.Generator().manual_seed(rank)) + 3 * rank
    for cls in (NaiveDDP, BucketedDDP):
        for broadcast in (True, False):
            model = nn.Sequential(MLP(seed=0), nn.BatchNorm1d(8))
            seen = []
            model[1].register_forward_pre_hook(
                lambda m, a, seen=seen: seen.append(m.running_mean.clone())
            )
            ddp = cls(model, broadcast_buffers=broadcast)
            for _ in range(3):
                ddp(data).sum().backward()
            calls = ddp.comm.calls["broadcast"]
            with torch.no_grad():
                ddp(data)
            with ddp.no_sync():
                ddp(data).sum().backward()
            quiet = ddp.comm.calls["broadcast"] - calls
            out[f"{cls.__name__} buffers broadcast={broadcast}"] = (seen[2], quiet)

    # 2. no_sync: three micro-batches, one all-reduce per bucket, full-batch gradients.
    x, y = mlp_batch(24, seed=5)
    reference = MLP(seed=0)
    loss_fn(reference, (x, y)).backward()
    for scale in (True, False):
        ddp = BucketedDDP(MLP(seed=0), bucket_cap_mb=0.004)
        local = shard((x, y), rank, world_size)
        micro = list(zip(local[0].chunk(3), local[1].chunk(3)))
        calls = ddp.comm.calls["all_reduce"]
        accumulate_gradients(ddp, loss_fn, micro, scale_loss=scale)
        out[f"calls scale={scale}"] = (ddp.comm.calls["all_reduce"] - calls, len(ddp.buckets))
        grads = [p.grad for p in ddp.module.parameters()]
        out[f"scale error scale={scale}"] = gradient_scale_error(
            grads, [p.grad for p in reference.parameters()]
        )

    # 3. The gradients really are averaged: not the local ones.
    ddp = NaiveDDP(MLP(seed=0))
    local_model = MLP(seed=0)
    loss_fn(ddp, shard((x, y), rank, world_size)).backward()
    loss_fn(local_model, shard((x, y), rank, world_size)).backward()
    out["averaged differs from local"] = any(
        not torch.allclose(a.grad, b.grad)
        for a, b in zip(ddp.module.parameters(), local_model.parameters())
    )
    return out


@pytest.fixture(scope="module")
def ddp_results():
    return distlab.run(_ddp_worker, 2, timeout=120)


def test_construction_broadcasts_rank0_parameters_and_buffers(ddp_results):
    for name in ("NaiveDDP state", "BucketedDDP state"):
        rank0, rank1 = ddp_results[0][name], ddp_results[1][name]
        for key in rank0:
            assert torch.equal(rank0[key], rank1[key]), (name, key)
        assert float(rank1["1.running_mean"][0]) == 0.0


def test_each_training_forward_uses_rank0s_buffers(ddp_results):
    for name in ("NaiveDDP", "BucketedDDP"):
        (on0, quiet0), (on1, quiet1) = (r[f"{name} buffers broadcast=True"] for r in ddp_results)
        assert torch.equal(on0, on1), f"{name}: ranks normalised with different running means"
        assert quiet0 == quiet1 == 0, f"{name}: broadcast under no_grad or inside no_sync"
        off0, off1 = (r[f"{name} buffers broadcast=False"][0] for r in ddp_results)
        assert (off0 - off1).abs().max() > 0.01, f"{name}: broadcast_buffers=False still syncs"


def test_no_sync_communicates_once_and_accumulates_the_full_batch_gradient(ddp_results):
    for result in ddp_results:
        calls, buckets = result["calls scale=True"]
        assert calls == buckets > 1
        assert result["scale error scale=True"] == pytest.approx(1.0, rel=1e-5)


def test_forgetting_the_scaling_under_ddp_is_caught(ddp_results):
    for result in ddp_results:
        assert result["scale error scale=False"] == pytest.approx(3.0, rel=1e-5)


def test_ddp_gradients_are_averaged_over_ranks(ddp_results):
    assert all(result["averaged differs from local"] for result in ddp_results)


# ---------------------------------------------------------------- overlap ----
def _trace_worker(rank, world_size):
    import torch

    torch.set_num_threads(1)
    from distlab.models import MLP
    from distlab.parallel import BucketedDDP

    ddp = BucketedDDP(MLP((128, 512, 512, 512, 512, 64), seed=0), bucket_cap_mb=1.0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(256, 128)
    for _ in range(3):
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    return ddp.trace.steps[-1], [b.n_bytes for b in ddp.buckets]


def test_trace_shows_bucket_all_reduces_overlapping_backward():
    from distlab.viz.overlap_plots import plot_step_trace

    for trace, sizes in distlab.run(_trace_worker, 2, timeout=120):
        assert len(trace.buckets) == len(sizes) >= 3
        assert [b.n_bytes for b in trace.buckets] == sizes
        for b in trace.buckets:
            assert trace.forward_end <= b.ready <= b.start <= b.end <= trace.sync_end
        starts = [b.start for b in trace.buckets]
        assert starts == sorted(starts)  # launched in bucket order
        assert trace.buckets[0].start < trace.backward_end  # the first all-reduce overlaps
        assert trace.overlapped_seconds > 0
    fig = plot_step_trace(trace)
    assert len(fig.axes[0].collections) == 2 + len(sizes)  # forward, backward, one bar per bucket


# --------------------------------------------------- naive against bucketed ----
TIMING = {"sizes": (32, 64, 64, 64, 8), "batch": 16, "steps": 3, "warmup": 1, "bucket_cap_mb": 0.02}


def _timing_worker(rank, world_size):
    import torch

    torch.set_num_threads(1)
    from distlab.parallel.data.ddp_timing import time_ddp_variants

    return time_ddp_variants(rank, world_size, **TIMING)


def test_naive_and_bucketed_ddp_are_timed_side_by_side():
    from distlab.parallel.data.ddp_timing import VARIANTS, format_table, summarise
    from distlab.viz.overlap_plots import plot_step_times

    per_rank = distlab.run(_timing_worker, 2, timeout=120)
    n_tensors = 2 * (len(TIMING["sizes"]) - 1)  # a weight and a bias per layer
    for result in per_rank:
        assert list(result) == list(VARIANTS)
        for timing in result.values():
            assert len(timing.step_seconds) == TIMING["steps"] and min(timing.step_seconds) > 0
            assert timing.n_tensors == n_tensors
        assert result["naive"].collectives_per_step == n_tensors
        for name in ("bucketed", "bucketed_overlap"):
            assert 1 < result[name].collectives_per_step == result[name].n_buckets < n_tensors
            assert len(result[name].traces) == TIMING["steps"]
        for trace in result[
            "bucketed"
        ].traces:  # overlap=False: nothing starts before backward ends
            assert all(b.start >= trace.backward_end for b in trace.buckets)
            assert trace.overlapped_seconds == 0
    rows = summarise(per_rank)
    assert [r.variant for r in rows] == list(VARIANTS)
    slowest_naive = [max(a, b) for a, b in zip(*(r["naive"].step_seconds for r in per_rank))]
    assert rows[0].median_seconds == sorted(slowest_naive)[1] and rows[0].speedup_over_naive == 1
    for row in rows[1:]:
        assert row.speedup_over_naive == pytest.approx(rows[0].median_seconds / row.median_seconds)
        assert row.exposed_comm_seconds > 0
    table = format_table(rows)
    assert all(name in table for name in VARIANTS) and "naive / this" in table
    fig = plot_step_times([(r.variant, r.median_seconds) for r in rows])
    assert len(fig.axes[0].patches) == len(VARIANTS)
