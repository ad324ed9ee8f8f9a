"""The mesh: its groups against torch's init_device_mesh and Megatron's layout, and an
EP=2 x expert-DP=2 training run on 4 gloo ranks against single-process training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import distlab
from distlab.core.layout import Layout
from distlab.core.ranks import coordinates
from distlab.parallel.moe.layer import MoE

# dense degrees on 4 ranks; ep re-splits dp * cp
CONFIGS = [
    {"tp": 2, "dp": 2},
    {"pp": 2, "dp": 2},
    {"tp": 2, "cp": 2},
    {"tp": 2, "pp": 2},
    {"dp": 4, "ep": 2},
    {"tp": 2, "dp": 2, "ep": 2},
]


def _compare_with_device_mesh(rank, world_size):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from distlab.parallel.compose.mesh import build_mesh

    results = []
    for degrees in CONFIGS:
        mesh = build_mesh(**degrees)
        torch_ranks = {}
        for expert in (False, True):
            shape, names = mesh.layout.device_mesh_shape(expert=expert)
            device_mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
            for name in names:
                group = device_mesh.get_group(name)
                torch_ranks[name] = dist.get_process_group_ranks(group)
        ours = {name: mesh.ranks(name) for name in torch_ranks}
        # the process groups really hold those ranks
        groups = {name: dist.get_process_group_ranks(mesh[name]) for name in torch_ranks}
        results.append((ours, torch_ranks, groups, mesh.coordinates, mesh.next_stage_rank))
    return results


def test_mesh_groups_equal_init_device_mesh():
    results = distlab.run(_compare_with_device_mesh, world_size=4, show_output=False)
    for rank, per_config in enumerate(results):
        for degrees, (ours, theirs, groups, coords, next_stage) in zip(CONFIGS, per_config):
            assert ours == theirs == groups, (rank, degrees)
            dense = {k: v for k, v in degrees.items() if k != "ep"}
            assert {k: coords[k] for k in ("tp", "cp", "dp", "pp")} == coordinates(rank, 4, **dense)
            pp = degrees.get("pp", 1)
            expected_next = rank + 4 // pp if coords["pp"] < pp - 1 else None
            assert next_stage == expected_next


def test_layout_megatron_example():
    # initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4 -> dp=2
    layout = Layout.for_world(16, tp=2, pp=4)
    assert layout.dp == 2
    assert layout.group_of("tp", 5) == [4, 5]
    assert layout.group_of("pp", 5) == [1, 5, 9, 13]
    assert layout.group_of("dp", 5) == [5, 7]
    assert layout.coordinates(13) == {
        "tp": 1, "cp": 0, "dp": 0, "pp": 3, "dp-cp": 0, "ep": 0, "expert_dp": 0,
    }  # fmt: skip


def test_bad_degrees():
    with pytest.raises(ValueError, match="world_size=6 is not divisible by tp\\*cp\\*pp=4"):
        Layout.for_world(6, tp=2, pp=2)
    with pytest.raises(ValueError, match="needs 4 ranks, not world_size=8"):
        Layout.for_world(8, tp=2, dp=2)
    with pytest.raises(ValueError, match="ep=3 must divide cp\\*dp=4"):
        Layout.for_world(4, ep=3)
    with pytest.raises(KeyError, match="no group 'xp'"):
        Layout.for_world(4).group_of("xp", 0)


def _bad_mesh(rank, world_size):
    from distlab.parallel.compose.mesh import build_mesh

    build_mesh(tp=3)


def test_bad_degrees_fail_every_rank():
    with pytest.raises(distlab.launch.RankError, match="not divisible by tp\\*cp\\*pp=3"):
        distlab.run(_bad_mesh, world_size=4, show_output=False)


# ------------------------------------------------------------ training run ---
IN, HIDDEN, OUT, TOKENS, STEPS, LR, AUX = 5, 8, 3, 12, 4, 0.2, 0.01


class TinyMoENet(nn.Module):
    """Linear -> residual MoE (4 experts, top-2) -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(IN, HIDDEN)
        self.moe = MoE(HIDDEN, 12, 4, top_k=2, capacity_factor=1.0, seed=1)
        self.head = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        h = self.inp(x)
        return self.head(h + self.moe(h))


def _batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(TOKENS, IN, generator=g), torch.randn(TOKENS, OUT, generator=g)


def _loss(model, step, rank):
    x, y = _batch(step, rank)
    return nn.functional.mse_loss(model(x), y) + AUX * model.moe.aux_loss


def _train_ep(rank, world_size):
    import torch.distributed as dist

    from distlab.parallel.compose.mesh import build_mesh
    from distlab.parallel.moe.layer import ExpertParallelMoE, average_moe_gradients

    mesh = build_mesh(ep=2)  # dp = 4 for the dense layers, ep = 2 x expert_dp = 2
    model = TinyMoENet()
    model.moe = ExpertParallelMoE.from_dense(model.moe, group=mesh["ep"])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = _loss(model, step, rank)
        loss.backward()
        average_moe_gradients(model, mesh)
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world_size)
    return losses, mesh.coordinates, {k: v.detach() for k, v in model.state_dict().items()}


def test_ep2_dp2_training_equals_single_process():
    results = distlab.run(_train_ep, world_size=4, show_output=False)
    reference = TinyMoENet()
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = sum(_loss(reference, step, r) for r in range(4)) / 4
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    want = reference.state_dict()
    for rank, (got_losses, coords, state) in enumerate(results):
        assert got_losses == pytest.approx(losses, rel=1e-5)
        assert coords["ep"] == rank % 2 and coords["expert_dp"] == rank // 2
        for name, value in state.items():
            if name.startswith("moe.experts."):
                _, _, index, rest = name.split(".", 3)
                name = f"moe.experts.{int(index) + 2 * coords['ep']}.{rest}"
            torch.testing.assert_close(value, want[name], rtol=1e-5, atol=1e-6)
    start = TinyMoENet().state_dict()
    assert all(not torch.equal(start[k], want[k]) for k in want)  # every parameter moved
