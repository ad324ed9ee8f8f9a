"""Mixture of experts and expert parallelism (notebook 09).

==========  ======================================================================
``layer``   routing (top-k, capacity, load-balancing loss), :class:`MoE` on one rank,
            :class:`ExpertParallelMoE` with its experts spread over ranks and tokens
            sent to them by all-to-all
``gpt``     the tiny GPT with MoE blocks (:class:`MoEGPT`) and its tensor- and
            expert-parallel block
==========  ======================================================================
"""

from __future__ import annotations

from .gpt import MoEConfig, MoEGPT
from .layer import (
    ALL_TO_ALL_ALGORITHMS,
    AllToAll,
    Expert,
    ExpertParallelMoE,
    MoE,
    Router,
    Routing,
    average_moe_gradients,
    exchange_blocks,
    expert_load,
    load_balance_run,
    route,
)

__all__ = [
    "ALL_TO_ALL_ALGORITHMS",
    "AllToAll",
    "Expert",
    "ExpertParallelMoE",
    "MoE",
    "MoEConfig",
    "MoEGPT",
    "Router",
    "Routing",
    "average_moe_gradients",
    "exchange_blocks",
    "expert_load",
    "load_balance_run",
    "route",
]
