"""ZeRO stages 1 and 2: shard the optimizer state (and the gradients) across ranks.

Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", Section 5.1-5.2, Figure 1). In plain data
parallelism every rank keeps the full optimizer state and runs the same
update K times. ZeRO splits the flattened parameters into K shards
(:mod:`distlab.parallel.zero.flat`) and lets rank ``r`` update only shard ``r``:

* **stage 1 (P_os)**: the optimizer state (Adam's m and v, and the fp32
  master weights if the model is in bf16/fp16) exists only for the own shard.
  After backward the full local gradients are **reduce-scattered**, so each
  rank receives the averaged gradient of its shard; it updates the shard;
  an **all-gather** puts the updated parameters back on every rank.
* **stage 2 (P_os+g)**: in addition, gradients are reduce-scattered *during*
  backward, bucket by bucket as they become ready (buckets as in DDP, see
  :mod:`distlab.parallel.comm.buckets`), and the full gradients are freed at once:
  a rank keeps only its shard's gradient.

Per step a rank sends Ψ(K-1)/K elements in the reduce-scatter and Ψ(K-1)/K
in the all-gather: the same 2Ψ(K-1)/K as DDP's all-reduce (Section 7.2.1).

The model stays a plain module (every rank holds all parameters); this class
replaces the optimizer: ``ZeroOptimizer(model, torch.optim.Adam, stage=2, lr=1e-3)``.
Stage 2's reduce-scatters run inside backward, one bucket at a time, on the
training thread (no overlap here; DDP shows overlap).
"""

from __future__ import annotations

import torch
from torch import nn

from distlab.collectives.buffers import Group
from distlab.parallel.comm.buckets import (
    DEFAULT_BUCKET_CAP_MB,
    ReadyInOrder,
    assign_buckets,
    bucket_cap_bytes,
    trainable_parameters,
)
from distlab.parallel.comm.collectives import Collectives, broadcast_module_state
from distlab.parallel.precision.memory import optimizer_state_tensors
from distlab.parallel.zero.flat import FlatGroup


class ZeroOptimizer:
    """ZeRO-1 or ZeRO-2 around a torch optimizer class."""

    def __init__(
        self,
        model: nn.Module,
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
        *,
        stage: int = 1,
        algorithm: str = "ring",
        group: Group = None,
        bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
        **optimizer_kwargs,
    ):
        if stage not in (1, 2):
            raise ValueError(
                f"stage must be 1 or 2 (stage 3 is distlab.parallel.FSDP), got {stage!r}"
            )
        self.model, self.stage = model, stage
        self.comm = Collectives(algorithm, group)
        broadcast_module_state(model, self.comm)
        rank, k = self.comm.rank, self.comm.world_size
        buckets = assign_buckets(trainable_parameters(model)[::-1], bucket_cap_bytes(bucket_cap_mb))
        self.flat_groups = [FlatGroup(b, rank, k) for b in buckets]
        self.flat_params, self.masters = [], []
        for g in self.flat_groups:
            flat = torch.zeros(g.padded_numel, dtype=g.dtype, device=g.device)
            g.bind(flat)  # the model's parameters now live in `flat`
            shard = g.shard_of(flat)
            # fp32 model: the optimizer updates the shard in place (a view).
            # bf16/fp16 model: it updates an fp32 master copy of the shard.
            master = shard if g.dtype == torch.float32 else shard.detach().float().clone()
            self.flat_params.append(flat)
            self.masters.append(nn.Parameter(master))
        self.grad_shards: list[torch.Tensor] = []
        if stage == 2:
            self.grad_shards = [
                torch.zeros(g.shard_numel, dtype=g.dtype, device=g.device) for g in self.flat_groups
            ]
            self._tracker = ReadyInOrder(
                [g.params for g in self.flat_groups], self._reduce_scatter_bucket, lambda: None
            )
        self.optimizer = optimizer_class(self.masters, **optimizer_kwargs)

    # ---------------------------------------------------------- gradients ----
    def _reduce_scatter(self, group: FlatGroup) -> torch.Tensor:
        """This rank's shard of the rank-averaged gradients of ``group``."""
        flat_grad = group.flatten([p.grad for p in group.params])
        out = torch.empty(group.shard_numel, dtype=group.dtype, device=group.device)
        self.comm.reduce_scatter_mean(out, flat_grad)
        return out

    def _reduce_scatter_bucket(self, index: int) -> None:  # stage 2, during backward
        group = self.flat_groups[index]
        self.grad_shards[index].add_(self._reduce_scatter(group))
        for p in group.params:
            p.grad = None  # the full gradient is no longer needed: free it

    # --------------------------------------------------------------- step ----
    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shards, then all-gather the parameters."""
        for i, (group, master) in enumerate(zip(self.flat_groups, self.masters)):
            grad = self._reduce_scatter(group) if self.stage == 1 else self.grad_shards[i]
            master.grad = grad if grad.dtype == master.dtype else grad.to(master.dtype)
        self.optimizer.step()
        for group, flat, master in zip(self.flat_groups, self.flat_params, self.masters):
            master.grad = None
            shard = group.shard_of(flat)
            if master.data_ptr() != shard.data_ptr():
                shard.copy_(master)  # round the fp32 master to the model's dtype
            self.comm.all_gather(flat, shard.clone())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the local gradients (stage 2 keeps its zeroed shards)."""
        for group in self.flat_groups:
            for p in group.params:
                p.grad = None
        for grad in self.grad_shards:
            grad.zero_()

    def after_load(self) -> None:
        """Copy the (just loaded) masters into the model's parameters on every rank."""
        with torch.no_grad():
            for group, flat, master in zip(self.flat_groups, self.flat_params, self.masters):
                shard = group.shard_of(flat)
                if master.data_ptr() != shard.data_ptr():
                    shard.copy_(master)
                self.comm.all_gather(flat, shard.clone())

    # ------------------------------------------------------------- memory ----
    def model_state_tensors(self) -> dict[str, list]:
        """What this rank holds (see :mod:`distlab.parallel.precision.memory`)."""
        params = list(self.model.parameters())
        grads = [p.grad for p in params] + self.grad_shards
        states, counters = optimizer_state_tensors(self.optimizer)
        return {
            "parameters": params,
            "gradients": grads,
            "optimizer_states": self.masters + states,
            "optimizer_step_counters": counters,
        }

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups
