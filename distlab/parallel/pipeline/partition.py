"""Cutting a model into pipeline stages: layers in order, split so the stages balance.

A pipeline stage is a contiguous run of layers. With p ranks and v chunks
per rank there are p v virtual stages; virtual stage j = c p + r is chunk c
of rank r (Narayanan et al. 2021, Section 2.2.2). :func:`balanced_split`
picks the cut points that make the most expensive stage as cheap as
possible (the slowest stage sets the pipeline's pace), for a cost per layer
that is either its parameter count (:func:`parameter_costs`) or its measured
forward + backward time (:func:`measured_costs`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from distlab.core.checks import positive_int
from distlab.models import GPT, check_tokens


class GPTEmbedding(nn.Module):
    """The GPT's first layer: token + position embeddings (the GPT's own modules, shared).
    Also serves a :class:`~distlab.parallel.tensor.ParallelGPT`, whose ``tok`` is
    vocabulary-parallel."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.tok, self.pos, self.config = model.tok, model.pos, model.config

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        check_tokens(tokens, self.config)
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))


class GPTHead(nn.Module):
    """The GPT's last layer: final LayerNorm and the language-model head, giving logits."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))


def gpt_layers(model: GPT) -> list[nn.Module]:
    """``[embedding, block 0, ..., block L-1, head]``: run in order, they compute ``model(tokens)``."""
    return [GPTEmbedding(model), *model.blocks, GPTHead(model)]


def parameter_costs(layers: Sequence[nn.Module]) -> list[float]:
    """Parameters per layer (a weight shared by two layers counts in both)."""
    return [float(sum(p.numel() for p in layer.parameters())) for layer in layers]


def measured_costs(
    layers: Sequence[nn.Module], sample: torch.Tensor, repeats: int = 3
) -> list[float]:
    """Seconds of forward + backward per layer on ``sample`` (the best of ``repeats``)."""
    costs, x = [], sample
    for layer in layers:
        x_in = x.detach().requires_grad_(x.is_floating_point())
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            out = layer(x_in)
            out.float().sum().backward()
            best = min(best, time.perf_counter() - start)
        layer.zero_grad(set_to_none=True)
        costs.append(best)
        x = out.detach()
    return costs


def balanced_split(costs: Sequence[float], parts: int) -> list[range]:
    """Cut ``costs`` (one per layer) into ``parts`` contiguous, non-empty runs that
    minimise the largest run's total (the classic linear-partition dynamic program)."""
    n = len(costs)
    parts = positive_int("parts", parts)
    if parts > n:
        raise ValueError(f"cannot cut {n} layers into {parts} non-empty stages; use at most {n}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[k][i]: the smallest possible largest-stage cost for the first i layers in k stages
    best = [[float("inf")] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for s in range(k - 1, i):
                value = max(best[k - 1][s], prefix[i] - prefix[s])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, s
    bounds, i = [], n
    for k in range(parts, 0, -1):
        bounds.append(range(cut[k][i], i))
        i = cut[k][i]
    return bounds[::-1]
