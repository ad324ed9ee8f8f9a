"""Cutting the tiny GPT into pipeline stages: balanced cuts, and stages that compose to the model."""

from __future__ import annotations

import itertools

import pytest
import torch

from distlab.models import GPT, GPTConfig, gpt_batch
from distlab.parallel.pipeline import balanced_split, gpt_layers, gpt_stage, parameter_costs


def brute_force_best(costs, parts):
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@pytest.mark.parametrize(
    ("costs", "parts"),
    [([1, 1, 1, 1], 2), ([5, 1, 1, 1, 1, 1], 2), ([3, 1, 4, 1, 5, 9, 2, 6], 3), ([2, 7, 1], 3)],
)
def test_balanced_split_is_optimal_and_contiguous(costs, parts):
    cut = balanced_split(costs, parts)
    assert [i for r in cut for i in r] == list(range(len(costs)))
    assert all(len(r) > 0 for r in cut)
    assert max(sum(costs[i] for i in r) for r in cut) == brute_force_best(costs, parts)


def test_balanced_split_bad_input():
    with pytest.raises(ValueError, match="cannot cut 3 layers into 4"):
        balanced_split([1, 1, 1], 4)
    with pytest.raises(ValueError, match="parts must be an integer >= 1"):
        balanced_split([1, 1], 0)


def test_stages_compose_to_the_model():
    config = GPTConfig(layers=4)
    model = GPT(config, seed=0)
    tokens, _ = gpt_batch(2, config)
    assert torch.equal(torch.nn.Sequential(*gpt_layers(model))(tokens), model(tokens))
    costs = parameter_costs(gpt_layers(model))
    for p, v in ((2, 1), (3, 1), (2, 2)):
        stages = [gpt_stage(model, r, p, chunks=v) for r in range(p)]
        x = tokens
        for j in range(p * v):  # virtual stage j = chunk * p + rank
            x = stages[j % p].chunks[j // p](x)
        assert torch.equal(x, model(tokens))
        per_stage = [sum(costs[i] for i in r) for r in balanced_split(costs, p * v)]
        assert max(per_stage) == brute_force_best(costs, p * v)
    # the shared (tied) embedding weight: ranks 0 and p - 1 sum its gradient
    first, last = gpt_stage(model, 0, 3), gpt_stage(model, 2, 3)
    assert first.tied_peer == 2 and last.tied_peer == 0
    assert first.tied[0] is model.tok.weight
    assert gpt_stage(model, 1, 3).tied == []


def test_balance_by_time_and_by_hand():
    config = GPTConfig(layers=2)
    model = GPT(config, seed=0)
    tokens, _ = gpt_batch(2, config)
    timed = gpt_stage(model, 0, 2, balance="time", sample=tokens)
    assert len(list(timed.chunks[0])) >= 1
    by_hand = gpt_stage(model, 1, 2, balance=[range(1), range(1, 4)])
    assert len(list(by_hand.chunks[0])) == 3
    with pytest.raises(ValueError, match="must cut layers 0..3 in order into 2 ranges"):
        gpt_stage(model, 0, 2, balance=[range(2), range(3, 4)])
    with pytest.raises(ValueError, match="unknown balance 'flops'"):
        gpt_stage(model, 0, 2, balance="flops")
    with pytest.raises(ValueError, match="needs sample tokens"):
        gpt_stage(model, 0, 2, balance="time")
