"""distlab's tensor- and sequence-parallel MLP beside torch's own (DTensor), on 2 and 4 gloo ranks.

torch: ``init_device_mesh("cpu", (t,))`` and ``parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel`` (and ``SequenceParallel`` for a LayerNorm before the MLP); distlab:
:class:`~distlab.parallel.tensor.ParallelMLP` built from the same dense weights, fed the same
input and output gradient. Both issue one all-reduce forward and one backward (TP), or an
all-gather and a reduce-scatter each way (SP); counted with ``CommDebugMode`` for torch and
with distlab's own log.

What is equal and what is not (measured here, asserted below):

* the input gradient and every weight-gradient shard are bit-equal: both compute the same
  local products and sum the same partials with the same gloo all-reduce;
* the output differs in the last bits. torch adds the row-parallel bias inside the sharded
  computation: a Replicate bias meets a Partial(sum) product, so each rank adds ``b / t`` to
  its partial before the all-reduce (``Partial._partition_value``); distlab adds ``b`` once
  after it. The gap vanishes with a zero bias, and distlab's own operators computing torch's
  way (``g(X_r B_r + b/t)``) reproduce torch's output bit for bit. Bound: both sums round at
  most ``t`` times, each by at most eps of the running sum, so
  ``|gap| <= 2 t eps (sum_r |X_r B_r| + |b|)`` elementwise (eps = fp32 machine epsilon).

The last test runs the same comparison with two broken row-parallel layers (the all-reduce
dropped; the bias added on every rank, i.e. before the all-reduce without the 1/t) and checks
that the comparison catches both.
"""

from __future__ import annotations

import functools

import pytest
import torch

import distlab

HIDDEN, BATCH, SEQ = 16, 2, 8  # SEQ divisible by t = 2 and 4 (sequence parallelism)
ATTENTION_HEADS = 4  # divisible by t = 2 and 4
EPS = torch.finfo(torch.float32).eps


def _dense_and_inputs():
    """A LayerNorm + FeedForward with the same weights in every process, an input and dL/dz."""
    from torch import nn

    from distlab.models import FeedForward

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        dense = nn.ModuleDict({"norm": nn.LayerNorm(HIDDEN), "mlp": FeedForward(HIDDEN, 0.0)})
        with torch.no_grad():  # a LayerNorm that is not the identity at initialisation
            dense.norm.weight.uniform_(0.5, 1.5)
            dense.norm.bias.uniform_(-0.5, 0.5)
        x, grad_z = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
    return dense, x, grad_z


def _torch_counts(mode) -> dict[str, int]:
    """CommDebugMode's counts as {"all_reduce": n, "all_gather": n, "reduce_scatter": n}."""
    short = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
    counts = {}
    for op, n in mode.get_comm_counts().items():
        name = str(op).rsplit(".", 1)[-1]
        counts[short.get(name, name)] = counts.get(short.get(name, name), 0) + n
    return counts


def _distlab_counts(comm, phase) -> dict[str, int]:
    counts = {}
    for event in comm.log:
        if event.phase == phase:
            counts[event.collective] = counts.get(event.collective, 0) + 1
    return counts


def _broken_row_forward(layer, x, *, mistake):
    """RowParallelLinear.forward with one mistake: "no all-reduce" or "bias on every rank"."""
    import torch.nn.functional as F

    from distlab.parallel.tensor.ops import reduce_from_tp

    partial = F.linear(x, layer.weight)
    if mistake == "no all-reduce":
        return partial + layer.bias
    return reduce_from_tp(partial + layer.bias, layer.comm, "broken out")


def _run_torch(dense, mesh, plan, x, grad_z):
    """``dense`` sharded by torch's ``parallelize_module(plan)``, forward and backward on a
    copy of ``x``: (module, input with its gradient, output, forward and backward counts)."""
    import copy

    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    theirs = parallelize_module(copy.deepcopy(dense), mesh, plan)
    x_theirs = x.clone().requires_grad_()
    with CommDebugMode() as forward:
        z_theirs = theirs(x_theirs)
    with CommDebugMode() as backward:
        z_theirs.backward(grad_z)
    z_theirs = z_theirs.detach().clone()  # an AsyncCollectiveTensor: wait for it
    counts = {"forward": _torch_counts(forward), "backward": _torch_counts(backward)}
    return theirs, x_theirs, z_theirs, counts


def _tensor_parallel(rank, world_size, dense, x, grad_z, mesh, mistake):
    """fc1 column-, fc2 row-parallel, by torch and by distlab; what the tests compare."""

    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
    )

    from distlab.parallel.tensor import ParallelMLP, TensorParallelComm
    from distlab.parallel.tensor.ops import copy_to_tp, reduce_from_tp

    comm = TensorParallelComm(algorithm="builtin")
    ours = ParallelMLP(dense, comm)
    if mistake:
        ours.fc2.forward = functools.partial(_broken_row_forward, ours.fc2, mistake=mistake)
    x_ours = x.clone().requires_grad_()
    z_ours = ours(x_ours)
    z_ours.backward(grad_z)

    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    theirs, x_theirs, z_theirs, torch_counts = _run_torch(dense, mesh, plan, x, grad_z)
    ours_counts = {p: _distlab_counts(comm, p) for p in ("forward", "backward")}

    with torch.no_grad():  # distlab's operators, torch's order: g(X_r B_r + b / t)
        partial = F.linear(F.gelu(ours.fc1(copy_to_tp(x, comm, "probe"))), ours.fc2.weight)
        torch_way = reduce_from_tp(partial + ours.fc2.bias / world_size, comm, "probe")
        magnitude = partial.abs()
        dist.all_reduce(magnitude)  # sum_r |X_r B_r|, for the rounding bound
    theirs_grads = {n: p.grad.to_local() for n, p in theirs.named_parameters()}
    return {
        "z": z_ours.detach(),
        "z_torch": z_theirs,
        "z_torch_way": torch_way,
        "bound": 2 * world_size * EPS * (magnitude + ours.fc2.bias.abs()),
        "x_grad_equal": torch.equal(x_ours.grad, x_theirs.grad),
        "grads_equal": {
            n: torch.equal(p.grad, theirs_grads[n]) for n, p in ours.named_parameters()
        },
        "distlab": ours_counts,
        "torch": torch_counts,
    }


def _sequence_parallel(rank, world_size, dense, x, grad_z, mesh):
    """LayerNorm on s/t tokens, then the MLP, by torch (SequenceParallel) and by distlab."""
    import copy

    from torch import nn
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from distlab.parallel.tensor import ParallelMLP, TensorParallelComm
    from distlab.parallel.tensor import sequence as sp

    x_shard, grad_shard = (t.chunk(world_size, 1)[rank] for t in (x, grad_z))
    comm = TensorParallelComm(algorithm="builtin")
    ours = nn.ModuleDict(
        {
            "norm": copy.deepcopy(dense.norm),
            "mlp": ParallelMLP(dense.mlp, comm, sequence_parallel=True),
        }
    )
    sp.mark_sequence_parallel(ours.norm)
    x_ours = x_shard.clone().requires_grad_()
    z_ours = ours.mlp(ours.norm(x_ours))
    z_ours.backward(grad_shard)
    sp.sync_sequence_parallel_grads(ours, comm)

    plan = {
        "norm": SequenceParallel(),
        "mlp.fc1": ColwiseParallel(input_layouts=Shard(1)),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
    }
    theirs = parallelize_module(copy.deepcopy(dense), mesh, plan)
    x_theirs = x_shard.clone().requires_grad_()
    with CommDebugMode() as forward:
        z_theirs = theirs.mlp(theirs.norm(x_theirs))
    with CommDebugMode() as backward:
        z_theirs.backward(grad_shard)
    with CommDebugMode() as grad_sync:  # the LayerNorm's gradients are Partial(sum) until here
        theirs_grads = {
            n: p.grad.full_tensor() if p.grad.placements[0].is_partial() else p.grad.to_local()
            for n, p in theirs.named_parameters()
        }
    return {
        "z": z_ours.detach(),
        "z_torch": z_theirs.detach().clone(),
        "x_grad_equal": torch.equal(x_ours.grad, x_theirs.grad),
        "grad_gaps": {
            n: (p.grad - theirs_grads[n]).abs().max().item() for n, p in ours.named_parameters()
        },
        "distlab": {p: _distlab_counts(comm, p) for p in ("forward", "backward")},
        "torch": {
            "forward": _torch_counts(forward),
            "backward": _torch_counts(backward),
            "grad sync": _torch_counts(grad_sync),
        },
    }


def _attention(rank, world_size, mesh):
    """distlab's CausalSelfAttention under torch's parallelize_module (q, k, v column-, proj
    row-parallel, its own forward unchanged: it takes the head count from the projections)
    beside distlab's ParallelSelfAttention and the dense module (issue 39)."""

    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
    )

    from distlab.models import CausalSelfAttention
    from distlab.parallel.tensor import ParallelSelfAttention, TensorParallelComm

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        dense = CausalSelfAttention(HIDDEN, ATTENTION_HEADS, 0.0, SEQ)
        x, grad_z = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
    x_dense = x.clone().requires_grad_()
    z_dense = dense(x_dense)
    z_dense.backward(grad_z)

    comm = TensorParallelComm(algorithm="builtin")
    ours = ParallelSelfAttention(dense, comm)
    x_ours = x.clone().requires_grad_()
    z_ours = ours(x_ours)
    z_ours.backward(grad_z)

    plan = {n: ColwiseParallel() for n in ("q", "k", "v")} | {"proj": RowwiseParallel()}
    theirs, x_theirs, z_theirs, torch_counts = _run_torch(dense, mesh, plan, x, grad_z)
    return {
        "local_q": theirs.q.weight.to_local().shape[0],
        "gap_torch": (z_theirs - z_dense).abs().max().item(),
        "gap_ours": (z_ours - z_dense).abs().max().item(),
        "x_grad_gap": (x_theirs.grad - x_dense.grad).abs().max().item(),
        "x_grad_ours_gap": (x_ours.grad - x_dense.grad).abs().max().item(),
        "torch": torch_counts,
        "distlab": {p: _distlab_counts(comm, p) for p in ("forward", "backward")},
    }


def _side_by_side(rank, world_size, mistakes=(None,)):
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    dense, x, grad_z = _dense_and_inputs()
    out = {
        mistake: _tensor_parallel(rank, world_size, dense.mlp, x, grad_z, mesh, mistake)
        for mistake in mistakes
    }
    with torch.no_grad():
        dense.mlp.fc2.bias.zero_()
    out["zero bias"] = _tensor_parallel(rank, world_size, dense.mlp, x, grad_z, mesh, None)
    if mistakes == (None,):
        out["sp"] = _sequence_parallel(rank, world_size, *_dense_and_inputs(), mesh)
        out["attention"] = _attention(rank, world_size, mesh)
    return out


@functools.cache
def _run(t: int, mistakes=(None,)):
    return distlab.run(_side_by_side, t, args=(mistakes,), timeout=300, show_output=False)


def _output_problems(res) -> list[str]:
    """What is wrong with distlab's TP output against torch's (empty: within the bound)."""
    gap = (res["z"] - res["z_torch"]).abs()
    if not torch.all(gap <= res["bound"]):
        return [f"output gap {gap.max().item():.2e} exceeds the rounding bound"]
    return []


@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_gradients_are_bit_equal_to_torch(t):
    for rank, per_mistake in enumerate(_run(t)):
        res = per_mistake[None]
        assert res["x_grad_equal"], f"t={t} rank {rank}: dL/dx differs from torch's"
        assert all(res["grads_equal"].values()), (t, rank, res["grads_equal"])
        assert set(res["grads_equal"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_output_differs_only_by_where_the_bias_is_added(t):
    for rank, per_mistake in enumerate(_run(t)):
        res = per_mistake[None]
        assert _output_problems(res) == [], (t, rank)
        assert torch.equal(res["z_torch_way"], res["z_torch"]), (
            f"t={t} rank {rank}: g(X_r B_r + b/t) is not torch's output bit for bit"
        )
        zero = per_mistake["zero bias"]
        assert torch.equal(zero["z"], zero["z_torch"]), f"t={t} rank {rank}: zero bias, gap"
        assert zero["x_grad_equal"] and all(zero["grads_equal"].values())
    gaps = [(r[None]["z"] - r[None]["z_torch"]).abs().max().item() for r in _run(t)]
    assert max(gaps) > 0, "no gap at all: the inputs no longer exercise the bias placement"


@pytest.mark.parametrize("t", [2, 4])
def test_both_run_one_all_reduce_forward_and_one_backward(t):
    want = {"forward": {"all_reduce": 1}, "backward": {"all_reduce": 1}}
    for res in _run(t):
        assert res[None]["distlab"] == want
        assert res[None]["torch"] == want


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_matches_torch(t):
    gather_scatter = {"all_gather": 1, "reduce_scatter": 1}
    for rank, per_mistake in enumerate(_run(t)):
        res = per_mistake["sp"]
        assert res["z"].shape == (BATCH, SEQ // t, HIDDEN)
        gap = (res["z"] - res["z_torch"]).abs().max().item()
        assert gap <= 2 * t * EPS * res["z_torch"].abs().max().item() + 1e-6, (t, rank, gap)
        assert res["x_grad_equal"], f"t={t} rank {rank}: SP dL/dx differs from torch's"
        gaps = res["grad_gaps"]
        assert [gaps[n] for n in ("mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight")] == [0] * 3
        # LayerNorm and fc2 bias: sums over tokens in another order (distlab: s/t tokens per
        # rank, then all-reduce; torch: per rank, then all-reduce of a Partial, or all tokens)
        assert max(gaps.values()) < 1e-5, (t, rank, gaps)
        assert res["torch"]["forward"] == gather_scatter
        assert res["torch"]["backward"] == gather_scatter
        assert res["distlab"]["forward"] == gather_scatter
        # distlab re-gathers the column layer's input in backward (saves the shard, not the
        # gathered sequence) and sums the LayerNorm and fc2 bias gradients in one all-reduce
        assert res["distlab"]["backward"] == {**gather_scatter, "all_gather": 2, "all_reduce": 1}
        assert res["torch"]["grad sync"] == {"all_reduce": 2}  # LayerNorm weight and bias


def test_the_comparison_catches_a_broken_row_parallel_layer():
    for rank, res in enumerate(_run(2, ("no all-reduce", "bias on every rank"))):
        for mistake in ("no all-reduce", "bias on every rank"):
            assert _output_problems(res[mistake]), f"rank {rank}: {mistake} not caught"
        # without its all-reduce the layer also runs no collective forward
        assert res["no all-reduce"]["distlab"]["forward"] == {}


@pytest.mark.parametrize("t", [2, 4])
def test_torch_shards_distlabs_attention_with_its_own_forward(t):
    """torch's parallelize_module runs distlab's attention unchanged on heads/t heads per rank
    (it raised "shape '[2, 8, 4, 4]' is invalid" while the forward reshaped to the full
    hidden size), with the dense module's output and input gradient up to rounding, as
    distlab's ParallelSelfAttention. Both all-reduce once forward; backward, distlab sums the
    three projections' input gradients before its one all-reduce, torch reduces each
    column-parallel projection's own (three)."""
    for rank, per_rank in enumerate(_run(t)):
        res = per_rank["attention"]
        assert res["local_q"] == HIDDEN // t, (t, rank)
        for gap in ("gap_torch", "gap_ours", "x_grad_gap", "x_grad_ours_gap"):
            assert res[gap] < 1e-5, (t, rank, gap, res[gap])
        assert res["torch"]["forward"] == res["distlab"]["forward"] == {"all_reduce": 1}
        assert res["distlab"]["backward"] == {"all_reduce": 1}
        assert res["torch"]["backward"] == {"all_reduce": 3}
