"""distlab beside torch's own (issue 28): data parallelism and the rank grid.

* ``torch.nn.parallel.DistributedDataParallel`` and distlab's ``BucketedDDP`` /
  ``NaiveDDP`` train the same model on the same shares on gloo processes. On 2 ranks
  every gradient and parameter is bit-equal: torch divides each gradient by K before
  its all-reduce, distlab after, and halving is exact; the sum of two numbers does not
  depend on their order. On 3-4 ranks the sums are added in another order (distlab's
  ring against gloo's), and dividing by 3 rounds, so they may differ by a rounding step.
* Torch's DDP all-reduces one bucket of every gradient in its first step, then the
  buckets it rebuilt from the order gradients arrived: from step 2 on, the same buckets
  as distlab's (``distlab.parallel.comm.buckets``, PyTorch's size rule). Torch's all-reduces
  are counted with a comm hook that calls torch's default all-reduce hook.
* ``torch.distributed.device_mesh.init_device_mesh`` forms the same process groups as
  distlab's rank grid (``rank_groups``, ``Layout``) when the dimensions are named
  slowest first (``pp``, ``dp``, ``tp``): torch's mesh is row-major, its last dimension
  varies fastest, and Megatron's order puts tp innermost.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.core.layout import Layout
from distlab.placement import rank_groups

GLOBAL_BATCH = 12  # divides by 2, 3 and 4 ranks
STEPS = 3
CAP_MB = 0.004  # two buckets for the default MLP: 5,280 and 2,176 bytes
FLOAT32_EPS = torch.finfo(torch.float32).eps


# ------------------------------------------------------------------ DDP ----
def _ddp_class(name: str):
    from distlab import parallel

    class Summing(parallel.NaiveDDP):
        """A broken DDP: all-reduces every gradient but never divides by the world size."""

        def sync_gradients(self) -> None:
            for p in self.params:
                self.comm.all_reduce_sum_(p.grad)

    return {
        "BucketedDDP": lambda m: parallel.BucketedDDP(m, bucket_cap_mb=CAP_MB),
        "NaiveDDP": parallel.NaiveDDP,
        "summing": Summing,
    }[name]


def _side_by_side(rank, world_size, ddp_name):
    """Train MLP(seed=rank) three ways on this rank's shares: with distlab's DDP, with torch's,
    and with torch's plus a counting comm hook. Per step: gradients, what was all-reduced."""
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from distlab import parallel
    from distlab.collectives import count_traffic
    from distlab.models import MLP, mlp_batch
    from distlab.parallel.data.training import mse_loss

    torch.set_num_threads(1)
    models = {name: MLP(seed=rank) for name in ("distlab", "torch", "torch counted")}
    wrapped = {
        "distlab": _ddp_class(ddp_name)(models["distlab"]),
        "torch": nn.parallel.DistributedDataParallel(models["torch"], bucket_cap_mb=CAP_MB),
        "torch counted": nn.parallel.DistributedDataParallel(
            models["torch counted"], bucket_cap_mb=CAP_MB
        ),
    }
    torch_buckets: list[list[int]] = []  # bytes of each bucket torch all-reduced, per step

    def counting_hook(state, bucket):
        buffer = bucket.buffer()
        torch_buckets[-1].append(buffer.numel() * buffer.element_size())
        return default_hooks.allreduce_hook(state, bucket)

    wrapped["torch counted"].register_comm_hook(None, counting_hook)
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.1) for name, m in models.items()}
    out = {"gradients": {name: [] for name in models}, "distlab_calls": [], "distlab_bytes": []}
    for step in range(STEPS):
        share = parallel.shard_batch(mlp_batch(GLOBAL_BATCH, seed=step), rank, world_size)
        torch_buckets.append([])
        for name, model in models.items():
            optimizers[name].zero_grad()
            calls = wrapped["distlab"].comm.calls["all_reduce"]
            with count_traffic() as traffic:
                mse_loss(wrapped[name], share).backward()
            if name == "distlab":
                out["distlab_calls"].append(wrapped[name].comm.calls["all_reduce"] - calls)
                out["distlab_bytes"].append(traffic.bytes_sent)
            out["gradients"][name].append([p.grad.clone() for p in model.parameters()])
            optimizers[name].step()
    out["parameters"] = {n: [p.detach().clone() for p in m.parameters()] for n, m in models.items()}
    out["torch_buckets"] = torch_buckets
    buckets = getattr(wrapped["distlab"], "buckets", None)
    out["distlab_buckets"] = [b.n_bytes for b in buckets] if buckets else None
    return out


_RUNS: dict = {}


def side_by_side(world_size: int, ddp_name: str = "BucketedDDP") -> list[dict]:
    """Each rank's results of :func:`_side_by_side` (one job per argument pair, cached)."""
    key = (world_size, ddp_name)
    if key not in _RUNS:
        _RUNS[key] = distlab.run(
            _side_by_side, world_size, args=(ddp_name,), timeout=120, show_output=False
        )
    return _RUNS[key]


def _tensors(result: dict, name: str) -> list[torch.Tensor]:
    """Every gradient of every step, then the final parameters, of one wrapper."""
    grads = [g for step in result["gradients"][name] for g in step]
    return grads + result["parameters"][name]


def largest_difference(result: dict, a: str, b: str) -> float:
    return max((x - y).abs().max().item() for x, y in zip(_tensors(result, a), _tensors(result, b)))


def bit_equal(result: dict, a: str, b: str) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_tensors(result, a), _tensors(result, b)))


def gradient_bytes() -> int:
    from distlab.models import MLP

    return sum(p.numel() * p.element_size() for p in MLP().parameters())


@pytest.mark.parametrize("ddp_name", ["BucketedDDP", "NaiveDDP"])
def test_two_ranks_train_bit_for_bit_like_torch_ddp(ddp_name):
    for rank, result in enumerate(side_by_side(2, ddp_name)):
        gap = largest_difference(result, "distlab", "torch")
        assert bit_equal(result, "distlab", "torch"), (rank, ddp_name, gap)


@pytest.mark.parametrize("world_size", [3, 4])
def test_more_ranks_differ_from_torch_by_a_rounding_step_at_most(world_size):
    for rank, result in enumerate(side_by_side(world_size)):
        scale = max(t.abs().max().item() for t in _tensors(result, "torch"))
        gap = largest_difference(result, "distlab", "torch")
        assert gap <= 2 * FLOAT32_EPS * scale, (rank, world_size, gap, scale)
        smallest_step = min(g.abs().max().item() for g in result["gradients"]["torch"][0])
        assert smallest_step > 1e3 * gap  # the bound is far below what a wrong average moves


def test_a_ddp_that_sums_instead_of_averaging_is_caught():
    for result in side_by_side(2, "summing"):
        assert not bit_equal(result, "distlab", "torch")
        assert largest_difference(result, "distlab", "torch") > 1e-3


def test_the_counting_hook_leaves_torch_ddp_unchanged():
    for world_size in (2, 4):
        for result in side_by_side(world_size):
            assert bit_equal(result, "torch", "torch counted")


@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_rebuilds_its_buckets_into_distlabs(world_size):
    total = gradient_bytes()
    for result in side_by_side(world_size):
        ours, theirs = result["distlab_buckets"], result["torch_buckets"]
        assert len(ours) == 2 and sum(ours) == total
        assert theirs[0] == [total]  # step 1: one bucket, the arrival order is not known yet
        assert theirs[1:] == [ours] * (STEPS - 1)  # then PyTorch's size rule, as distlab's
        assert result["distlab_calls"] == [len(ours)] * STEPS


@pytest.mark.parametrize("world_size", [2, 4])
def test_distlabs_ring_sends_two_k_minus_one_over_k_of_the_gradient(world_size):
    # both buckets' element counts divide by 2 and 4, so the ring's chunks are equal
    expected = 2 * (world_size - 1) * gradient_bytes() // world_size
    for result in side_by_side(world_size):
        assert result["distlab_bytes"] == [expected] * STEPS


# ----------------------------------------------------------------- mesh ----
def _torch_mesh_groups(rank, world_size, meshes):
    """For each (shape, names): this rank's group per name, from torch's DeviceMesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    out = []
    for shape, names in meshes:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        out.append({n: dist.get_process_group_ranks(mesh.get_group(n)) for n in names})
    return out


def megatron_mesh(world_size: int, **degrees) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The shape and names for init_device_mesh, slowest dimension first, sizes > 1 only."""
    layout = Layout.for_world(world_size, **degrees)
    named = [(n, getattr(layout, n)) for n in ("pp", "dp", "tp") if getattr(layout, n) > 1]
    return tuple(s for _, s in named), tuple(n for n, _ in named)


MESHES = {
    4: [{"tp": 2}, {"pp": 2, "tp": 2}, {"pp": 2}],
    8: [{"tp": 2}, {"tp": 4}, {"pp": 2, "tp": 2}, {"pp": 2}, {"tp": 2, "pp": 4}],
}
REVERSED = {4: {"tp": 2}, 8: {"tp": 2, "pp": 2}}  # every dimension of size 2


@pytest.fixture(scope="module")
def torch_groups() -> dict:
    """world size -> per rank, per mesh of MESHES, torch's groups of that rank by name."""
    results = {}
    for world_size, layouts in MESHES.items():
        meshes = [megatron_mesh(world_size, **d) for d in layouts]
        shape, names = megatron_mesh(world_size, **REVERSED[world_size])
        meshes.append((shape, names[::-1]))  # the same shape, named fastest first
        results[world_size] = distlab.run(
            _torch_mesh_groups, world_size, args=(meshes,), timeout=120, show_output=False
        )
    return results


@pytest.mark.parametrize(
    "world_size, index", [(w, i) for w, layouts in MESHES.items() for i in range(len(layouts))]
)
def test_init_device_mesh_forms_distlabs_rank_groups(torch_groups, world_size, index):
    degrees = MESHES[world_size][index]
    shape, names = megatron_mesh(world_size, **degrees)
    assert len(shape) in (1, 2, 3)
    layout = Layout.for_world(world_size, **degrees)
    ours = rank_groups(world_size, tp=layout.tp, dp=layout.dp, pp=layout.pp)
    for rank, per_mesh in enumerate(torch_groups[world_size]):
        theirs = per_mesh[index]
        for name in names:  # the same ranks in the same order (the coordinate along the axis)
            assert theirs[name] == layout.group_of(name, rank), (rank, degrees, name)
    for name in names:  # and every group of the job, no more, no fewer
        formed = {tuple(per_mesh[index][name]) for per_mesh in torch_groups[world_size]}
        assert formed == {tuple(g) for g in ours[name]}, (degrees, name)


def test_the_last_named_dimension_is_the_fastest(torch_groups):
    """The same all-2 shape named fastest first, ("tp", "dp") or ("tp", "dp", "pp"): torch's
    mesh is row-major, so the *last* name gets the consecutive ranks, and each name gets the
    groups of the dimension at its mirrored position in Megatron's order."""
    for world_size, degrees in REVERSED.items():
        shape, names = megatron_mesh(world_size, **degrees)
        assert set(shape) == {2} and len(names) == len(degrees) + 1  # dp = 2 too
        ours = rank_groups(world_size, **degrees, dp=2)
        per_rank = [per_mesh[-1] for per_mesh in torch_groups[world_size]]
        for name, mirrored in zip(names[::-1], names):
            formed = {tuple(groups[name]) for groups in per_rank}
            assert formed == {tuple(g) for g in ours[mirrored]}, (world_size, name, mirrored)
        assert per_rank[0]["tp"] != ours["tp"][0]  # tp named first is not tensor parallelism
