"""Expert parallelism: how many tokens an expert takes, and what its all-to-alls send.

Pure Python. :func:`expert_capacity` is the slot count that
:mod:`distlab.parallel.moe.layer` and :mod:`distlab.parallel.moe.gpt` route into;
:func:`moe_all_to_all_comm` the bytes their dispatch and combine all-to-alls send,
padding included (the formula :mod:`distlab.placement.score` prices too).
"""

from __future__ import annotations

import math

from distlab.core.checks import positive, positive_int

from .volume import AllToAllPart, CommVolume


def expert_capacity(
    tokens: int, num_experts: int, *, top_k: int = 1, capacity_factor: float = 1.25
) -> int:
    """Slots per expert on one rank: ``ceil(capacity_factor * tokens * top_k / num_experts)``.

    Switch Transformer (Fedus et al. 2021, Section 2.2, "expert capacity"):
    ``(tokens per batch / experts) x capacity factor``; with top-k routing each
    token makes k assignments, so GShard (Lepikhin et al. 2020, Algorithm 1)
    scales by k. ``tokens`` are the tokens one rank routes (each rank routes its
    own batch). Rounded **up**, so a capacity factor of 1 never drops a token
    of a perfectly balanced batch; the product is rounded to 9 decimals first
    so that e.g. 1.1 x 10 / 1 gives 11, not 12.
    """
    t = positive_int("tokens", tokens)
    e = positive_int("num_experts", num_experts)
    k = positive_int("top_k", top_k)
    if k > e:
        raise ValueError(f"top_k={k} must be <= num_experts={e}")
    factor = positive("capacity_factor", capacity_factor)
    return math.ceil(round(factor * t * k / e, 9))


def moe_all_to_all_comm(
    *,
    tokens: int,
    hidden: int,
    num_experts: int,
    ep: int,
    top_k: int = 1,
    capacity_factor: float = 1.25,
    moe_layers: int = 1,
    micro_batches: int = 1,
    bytes_per_element: int = 2,
) -> CommVolume:
    """All-to-all traffic of expert parallelism per rank per training step.

    Each rank routes its ``tokens`` into a fixed-size buffer of
    ``num_experts x C x hidden`` elements, ``C`` = :func:`expert_capacity`
    (empty slots are padding and are sent too: GShard, Lepikhin et al. 2020,
    Section 2.2 / Algorithm 1; Switch Transformer, Fedus et al. 2021,
    Section 2.2 and Figure 3). Per MoE layer the forward runs two all-to-alls
    over the ``ep`` ranks (dispatch to the experts, combine back), and the
    backward two more (their gradients, the same sizes in reverse; DeepSpeed-MoE,
    Rajbhandari et al. 2022, Section 5): 4 per layer, each sending
    ``(ep-1)/ep x num_experts x C x hidden x bytes_per_element`` bytes.
    (A layer whose input needs no gradient skips the last one.) With
    ``micro_batches`` per step, each micro-batch routes its ``tokens`` through
    every layer: ``4 x moe_layers x micro_batches`` all-to-alls.
    """
    k = positive_int("ep", ep)
    e = positive_int("num_experts", num_experts)
    if e % k:
        raise ValueError(f"num_experts={e} is not divisible by ep={k}; ep must divide it")
    capacity = expert_capacity(tokens, e, top_k=top_k, capacity_factor=capacity_factor)
    payload = (
        e
        * capacity
        * positive_int("hidden", hidden)
        * positive_int("bytes_per_element", bytes_per_element)
    )
    calls = positive_int("moe_layers", moe_layers) * positive_int("micro_batches", micro_batches)
    if k == 1:
        return CommVolume("expert parallel", ())
    return CommVolume(
        "expert parallel",
        (
            AllToAllPart("forward dispatch", k, payload, calls),
            AllToAllPart("forward combine", k, payload, calls),
            AllToAllPart("backward combine gradient", k, payload, calls),
            AllToAllPart("backward dispatch gradient", k, payload, calls),
        ),
    )
