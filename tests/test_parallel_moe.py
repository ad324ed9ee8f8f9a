"""Expert-parallel MoE on 1, 2 and 4 gloo ranks against the single-process layer.

Each rank routes its own batch; the reference runs the dense :class:`MoE`
(all experts in one process) on every rank's batch in turn, with the same
capacity rule, and sums the losses. Outputs and input gradients must match
per rank, each local expert's gradient the dense expert's, and the router's
gradient summed over ranks the dense router's (the router is replicated).
The capacity factor is small enough that tokens are dropped.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.calc.moe import expert_capacity, moe_all_to_all_comm
from distlab.parallel.moe.layer import MoE, route

HIDDEN, FFN, EXPERTS, TOKENS = 6, 10, 4, 12
AUX_WEIGHT = 0.1
CASES = [(1, "pairwise", 1.0), (2, "pairwise", 0.75), (2, "builtin", 0.75)]  # top_k, algo, cf


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g)
    weight = torch.randn(TOKENS, HIDDEN, generator=g)
    return x, weight


def _loss(layer, x, weight):
    return (layer(x) * weight).sum() + AUX_WEIGHT * layer.aux_loss


def _worker(rank, world_size):
    from distlab.collectives import count_traffic
    from distlab.parallel.moe.layer import ExpertParallelMoE

    results = []
    for top_k, algorithm, cf in CASES:
        dense = MoE(HIDDEN, FFN, EXPERTS, top_k=top_k, capacity_factor=cf, seed=3)
        layer = ExpertParallelMoE.from_dense(dense, algorithm=algorithm)
        x, weight = _batch(rank)
        x.requires_grad_(True)
        with count_traffic() as traffic:
            loss = _loss(layer, x, weight)
            loss.backward()
        results.append(
            {
                "y": layer(x).detach(),
                "x_grad": x.grad,
                "expert_grads": [[p.grad for p in expert.parameters()] for expert in layer.experts],
                "router_grad": layer.router.weight.grad,
                "dropped": layer.routing.dropped,
                "bytes_sent": traffic.bytes_sent,
                "local_experts": layer.local_experts,
            }
        )
    return results


@pytest.fixture(scope="module", params=[1, 2, 4])
def run(request):
    return request.param, distlab.run(_worker, world_size=request.param, show_output=False)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_expert_parallel_equals_dense(run, case):
    ep, results = run
    top_k, _, cf = CASES[case]
    dense = MoE(HIDDEN, FFN, EXPERTS, top_k=top_k, capacity_factor=cf, seed=3)
    dropped = 0
    for rank in range(ep):
        x, weight = _batch(rank)
        x.requires_grad_(True)
        _loss(dense, x, weight).backward()
        got = results[rank][case]
        torch.testing.assert_close(got["y"], dense(x).detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["x_grad"], x.grad, rtol=1e-5, atol=1e-6)
        dropped += dense.routing.dropped
        assert got["dropped"] == dense.routing.dropped
    assert dropped > 0, "the test should exercise token dropping"
    router_grad = sum(results[r][case]["router_grad"] for r in range(ep))
    torch.testing.assert_close(router_grad, dense.router.weight.grad, rtol=1e-5, atol=1e-6)
    for rank in range(ep):
        local = results[rank][case]["local_experts"]
        assert local == EXPERTS // ep
        for i, grads in enumerate(results[rank][case]["expert_grads"]):
            expert = dense.experts[rank * local + i]
            for got, want in zip(grads, [p.grad for p in expert.parameters()]):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_all_to_all_bytes_equal_calculator(run, case):
    ep, results = run
    top_k, algorithm, cf = CASES[case]
    predicted = moe_all_to_all_comm(
        tokens=TOKENS,
        hidden=HIDDEN,
        num_experts=EXPERTS,
        ep=ep,
        top_k=top_k,
        capacity_factor=cf,
        bytes_per_element=4,
    ).total
    for rank in range(ep):
        measured = results[rank][case]["bytes_sent"]
        if algorithm == "builtin":  # torch's collectives are not counted
            assert measured == 0
        else:
            assert measured == predicted
    if ep > 1 and algorithm == "pairwise":
        assert predicted > 0


@pytest.mark.parametrize("top_k", [1, 2])
def test_dropped_tokens_follow_capacity_formula(top_k):
    torch.manual_seed(0)
    tokens, experts = 40, 4
    logits = torch.randn(tokens, experts) + torch.tensor([1.5, 0.0, 0.0, -1.0])
    capacity = expert_capacity(tokens, experts, top_k=top_k, capacity_factor=1.0)
    routing = route(logits, top_k=top_k, capacity=capacity)
    chosen = logits.topk(top_k, dim=-1).indices.reshape(-1)
    per_expert = torch.bincount(chosen, minlength=experts)
    assert routing.dropped == int((per_expert - capacity).clamp(min=0).sum()) > 0
    assert routing.kept.tolist() == per_expert.clamp(max=capacity).tolist()
    assert int(routing.dispatch.sum()) == tokens * top_k - routing.dropped


def test_all_tokens_to_one_expert_keep_capacity():
    logits = torch.zeros(16, 4)
    logits[:, 2] = 5.0
    routing = route(logits, top_k=1, capacity=expert_capacity(16, 4, capacity_factor=1.25))
    assert routing.capacity == 5 and routing.dropped == 11
    assert routing.dispatch[:5, 2].sum() == 5  # first come, first served
    assert routing.load_balancing_loss().item() == pytest.approx(4 * routing.probs[0, 2].item())


def test_balanced_load_gives_aux_loss_one():
    logits = torch.zeros(8, 4)
    logits[torch.arange(8), torch.arange(8) % 4] = 1e-3  # uniform probs, even first choices
    assert route(logits, top_k=1, capacity=2).load_balancing_loss().item() == pytest.approx(1.0)


def test_bad_input():
    with pytest.raises(ValueError, match="top_k must be 1 or 2"):
        MoE(4, 8, 4, top_k=3)
    with pytest.raises(ValueError, match="capacity_factor"):
        MoE(4, 8, 4, capacity_factor=0)
    with pytest.raises(RuntimeError, match="no process group"):
        from distlab.parallel.moe.layer import ExpertParallelMoE

        ExpertParallelMoE.from_dense(MoE(4, 8, 4))


def _not_divisible(rank, world_size):
    from distlab.parallel.moe.layer import ExpertParallelMoE

    ExpertParallelMoE.from_dense(MoE(4, 8, 3))


def test_experts_not_divisible_by_ep_fails_every_rank():
    with pytest.raises(distlab.launch.RankError, match="num_experts=3 is not divisible by ep=2"):
        distlab.run(_not_divisible, world_size=2, show_output=False)


@pytest.fixture
def one_thread():
    """Tiny tensors: intra-op threads only fight over the cores (10x slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_balancing_loss_evens_the_load(one_thread):
    from distlab.parallel.moe.layer import load_balance_run
    from distlab.viz.moe_plots import plot_expert_load

    without = load_balance_run(aux_weight=0.0, steps=40)
    balanced = load_balance_run(aux_weight=1.0, steps=40)
    assert without[0].tolist() == balanced[0].tolist()  # same start
    assert without[-5:].max(dim=1).values.min() > 0.9  # collapsed onto one expert
    assert balanced[-5:].max(dim=1).values.max() < 0.45  # near 1/4 each
    fig = plot_expert_load({"no aux loss": without, "aux loss x 1.0": balanced})
    assert len(fig.axes) == 2
    assert len(fig.axes[0].lines) == 4 + 1  # one line per expert and the uniform line
    with pytest.raises(ValueError, match="steps, experts"):
        plot_expert_load({"bad": torch.zeros(3)})
