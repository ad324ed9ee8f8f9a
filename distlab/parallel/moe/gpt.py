"""The tiny GPT with mixture-of-experts MLPs, and its expert-parallel blocks.

Training it with any layout (TP x EP x DP, MoE blocks inside a pipeline, ...) is
:func:`distlab.parallel.compose.train` with ``Layout(ep=...)``; this module holds
the model, its routing groups and the expert-parallel block that
:func:`~distlab.parallel.compose.parallelize` puts in place of each MoE block.

**The model.** :class:`MoEGPT` is :class:`distlab.models.GPT` with the MLP of
every ``every``-th block replaced by a :class:`~distlab.parallel.moe.layer.MoE`
(router + ``E`` expert MLPs; Switch Transformer, Fedus et al. 2021, Section 2.1;
GShard, Lepikhin et al. 2020, Section 2.1, replaces every other block's;
Megatron-core calls ``every`` ``--moe-layer-freq``). Each MoE layer routes
top-k with a per-expert capacity and drops the overflow (Switch, Section 2.2)::

    C = ceil(capacity_factor * tokens_per_group * top_k / E)     (expert_capacity)

and adds the load-balancing loss ``E * sum_i f_i P_i`` (Switch, Section 2.2,
eq. 4) to the training loss, times ``aux_weight``, summed over the MoE layers.

**Routing groups.** Capacity is counted per *group* of tokens, not per batch:
GShard (Section 2.2, "local group dispatching", and Algorithm 1) splits the
batch into G groups, routes each on its own and averages the balancing loss
over them; with data parallelism each replica's
b/dp sequences are one group. So the single-process reference routes the
whole batch in ``routing_groups = dp`` slices (:class:`GroupedMoE`), the same
slices the replicas get, and then equals the distributed run exactly.

**The parallel model** (:func:`parallel_moe_gpt`): attention, embedding and
dense MLPs are Megatron tensor-parallel exactly as in
:class:`~distlab.parallel.tensor.ParallelGPT`; a MoE layer is an
:class:`~distlab.parallel.moe.layer.ExpertParallelMoE` over the ``"ep"`` group of
:func:`~distlab.parallel.compose.mesh.build_mesh`: the ranks with the same TP
coordinate in the data-parallel dimension, each holding ``E/ep`` whole experts
(expert tensor parallelism 1). The TP ranks of a replica hold the same
residual stream, so they compute the same routing on the same tokens, each in
its own EP group; their expert gradients are equal and need no TP reduction.

*Megatron-core does it differently*: with TP and EP it requires sequence
parallelism (Megatron-core MoE README, "Parallelism"), so each TP rank holds
s/t of the tokens, routes only those, and its all-to-all spans the TP x EP
ranks; no expert work is repeated. We keep the TP ranks' tokens whole because
distlab's :class:`ParallelGPT` keeps the full sequence on every TP rank (no
sequence parallelism here): splitting would add a scatter and a gather around
each MoE layer and tie the expert placement to tp. The price is that each TP
rank repeats its replica's expert compute and all-to-alls (t-fold).

**Gradients** (:func:`~distlab.parallel.moe.layer.average_moe_gradients`). Each
replica r's loss L_r is the mean over its b/dp sequences, the job's loss
L = (1/dp) sum_r L_r. A dense parameter (TP shard, LayerNorm, router) is
averaged over the ``dp`` ranks with its TP coordinate:
g = (1/dp) sum_r dL_r/dw. An expert's local gradient already sums
dL_r/dw over the replicas r of its ``ep`` group (their tokens came back
through the all-to-all), so it is summed over the ``expert_dp = dp/ep`` ranks
holding the same expert and divided by dp, giving the same
(1/dp) sum_r dL_r/dw (Megatron-core's expert-data-parallel group). With
world 8: tp = 2, dp = 4 = ep 2 x expert_dp 2.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from distlab.calc.moe import expert_capacity
from distlab.core.checks import positive_int
from distlab.models import GPT, GPTBlock, GPTConfig
from distlab.parallel.moe.layer import ExpertParallelMoE, MoE
from distlab.parallel.tensor import (
    ParallelBlock,
    ParallelGPT,
    ParallelSelfAttention,
    TensorParallelComm,
)
from distlab.parallel.tensor.checks import check_divisible


@dataclass(frozen=True)
class MoEConfig:
    """The MoE layers of a :class:`MoEGPT`: ``num_experts`` experts of ``ffn_hidden``
    (default 4 x hidden, like the dense MLP), top-k routing, capacity factor, and
    a MoE in place of the MLP of blocks ``every-1, 2*every-1, ...``."""

    num_experts: int = 4
    top_k: int = 1
    capacity_factor: float = 1.25
    every: int = 2
    ffn_hidden: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_experts", "every"):
            value = getattr(self, name)
            positive_int(name, value)
        if self.top_k not in (1, 2):
            raise ValueError(f"top_k must be 1 or 2, got {self.top_k!r}")
        expert_capacity(1, self.num_experts, top_k=self.top_k,
                        capacity_factor=self.capacity_factor)  # fmt: skip

    def is_moe_block(self, index: int) -> bool:
        return (index + 1) % self.every == 0


class GroupedMoE(MoE):
    """A :class:`MoE` that routes ``groups`` equal slices of its batch one after the
    other, each with its own capacity (GShard's groups, Algorithm 1); ``aux_loss``
    is the mean of the slices' balancing losses, ``routings`` their :class:`Routing` s.
    Other arguments as :class:`MoE`."""

    def __init__(self, *args, groups: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        groups = positive_int("groups", groups)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_divisible("batch", x.shape[0], self.groups, by="number of routing groups")
        outputs, losses, self.routings = [], [], []
        for part in x.chunk(self.groups):
            outputs.append(super().forward(part))
            losses.append(self.aux_loss)
            self.routings.append(self.routing)
        self.aux_loss = torch.stack(losses).mean()
        return torch.cat(outputs)


class MoEGPT(GPT):
    """``GPT(config, seed=seed)`` with a :class:`GroupedMoE` as the MLP of each MoE block.

    The MoE layer of block i is seeded ``seed + 1 + i``. ``routing_groups``: route
    the batch in that many slices (set it to the data-parallel size to match a
    data-parallel run). Train on ``loss(tokens, targets) + aux_weight * aux_loss(model)``.
    """

    def __init__(
        self, config: GPTConfig, moe: MoEConfig, *, seed: int = 0, routing_groups: int = 1
    ) -> None:
        super().__init__(config, seed=seed)
        self.moe_config = moe
        for i, block in enumerate(self.blocks):
            if moe.is_moe_block(i):
                block.mlp = GroupedMoE(
                    config.hidden, moe.ffn_hidden or 4 * config.hidden, moe.num_experts,
                    top_k=moe.top_k, capacity_factor=moe.capacity_factor, seed=seed + 1 + i,
                    groups=routing_groups,
                )  # fmt: skip


def moe_layers(model: nn.Module) -> list[MoE]:
    """The MoE layers of ``model`` (dense or expert-parallel), in order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def aux_loss(model: nn.Module) -> torch.Tensor:
    """Sum of the load-balancing losses the MoE layers left from the last forward."""
    return sum(layer.aux_loss for layer in moe_layers(model))


class ParallelMoEBlock(nn.Module):
    """A MoE block of :class:`MoEGPT`: tensor-parallel attention, expert-parallel MoE.

    Input and output are the whole ``(b, s, h)`` on every TP rank (no sequence
    parallelism), so the MoE sees the same tokens on each TP rank.
    """

    def __init__(self, dense: GPTBlock, comm: TensorParallelComm, ep_group, algorithm: str):
        super().__init__()
        self.ln1 = copy.deepcopy(dense.ln1)
        self.attn = ParallelSelfAttention(dense.attn, comm)
        self.ln2 = copy.deepcopy(dense.ln2)
        self.mlp = ExpertParallelMoE.from_dense(dense.mlp, group=ep_group, algorithm=algorithm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def parallel_moe_gpt(
    dense: MoEGPT, comm: TensorParallelComm, ep_group, *, algorithm: str = "pairwise"
) -> ParallelGPT:
    """This rank's share of ``dense``: a :class:`ParallelGPT` whose MoE blocks are
    :class:`ParallelMoEBlock` s (experts spread over ``ep_group``, all-to-all
    ``algorithm`` as in :data:`distlab.parallel.moe.layer.ALL_TO_ALL_ALGORITHMS`)."""

    def make_block(block: GPTBlock, comm: TensorParallelComm, *, sequence_parallel: bool):
        if isinstance(block.mlp, MoE):
            return ParallelMoEBlock(block, comm, ep_group, algorithm)
        return ParallelBlock(block, comm, sequence_parallel=sequence_parallel)

    return ParallelGPT(dense, comm, make_block=make_block)


def dense_expert_name(name: str, ep_rank: int, local_experts: int) -> str:
    """The dense name of a parallel parameter: local expert ``j`` of EP rank ``r`` is
    dense expert ``r * E/ep + j`` (``...mlp.experts.1.fc1.weight`` on EP rank 1 of
    2 with 4 experts -> ``...mlp.experts.3.fc1.weight``); other names are unchanged."""
    head, marker, rest = name.partition(".experts.")
    if not marker:
        return name
    local, tail = rest.split(".", 1)
    return f"{head}.experts.{ep_rank * local_experts + int(local)}.{tail}"


@dataclass(frozen=True)
class MoELayerStats:
    """One MoE layer's routing on one rank in one step: assignments per expert
    before dropping, the capacity ``C`` per expert, and the assignments dropped."""

    routed: tuple[int, ...]
    capacity: int
    dropped: int


def routing_stats(layer: MoE) -> MoELayerStats:
    """What ``layer``'s last forward routed, its capacity and what it dropped."""
    routing = layer.routing
    return MoELayerStats(tuple(routing.routed.tolist()), routing.capacity, routing.dropped)
