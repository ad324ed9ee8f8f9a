"""Bad input for tensor parallelism: found before the first collective, on every rank.

A shape that does not divide by t is the same on every rank, so every rank
raises the same ``ValueError`` on its own. Ranks that disagree (built from
different dense models, or with different sizes) would hang or silently train
different models; :func:`check_same_on_every_rank` all-gathers a fingerprint
and raises on every rank, naming each rank's value.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .ops import TensorParallelComm


def check_divisible(what: str, value: int, t: int, *, by: str = "tensor-parallel size") -> int:
    """``value // t``, or ``ValueError`` naming ``what`` when ``t`` does not divide it."""
    if value % t:
        raise ValueError(
            f"{what}={value} is not divisible by the {by} {t}: choose a size that is a "
            f"multiple of {t} (or a degree that divides {value})"
        )
    return value // t


def fingerprint(module: torch.nn.Module) -> list[float]:
    """Shape and sum of every parameter of ``module`` (float64): equal on ranks
    built from the same dense model."""
    values: list[float] = []
    for p in module.parameters():
        values.extend(float(n) for n in p.shape)
        values.append(p.detach().double().sum().item())
    return values


def check_same_on_every_rank(comm: TensorParallelComm, what: str, values: list[float]) -> None:
    """Raise ``ValueError`` on every rank of ``comm``'s group unless every rank
    passed the same ``values`` (one built-in all-gather, not counted in ``comm``)."""
    if comm.world_size == 1:
        return
    device = "cuda" if dist.get_backend(comm.group) == "nccl" else "cpu"
    local = torch.tensor([float(len(values)), *values], dtype=torch.float64, device=device)
    lengths = torch.zeros(comm.world_size, dtype=torch.float64, device=device)
    dist.all_gather_single(lengths, local[:1], group=comm.group)
    width = int(lengths.max().item())
    padded = torch.full((width + 1,), float("nan"), dtype=torch.float64, device=device)
    padded[: local.numel()] = local
    every = torch.empty(comm.world_size * (width + 1), dtype=torch.float64, device=device)
    dist.all_gather_single(every, padded, group=comm.group)
    rows = every.view(comm.world_size, width + 1).cpu().nan_to_num(-1.0)
    differ = (rows != rows[0]).any(dim=0).nonzero()
    if differ.numel():
        column = int(differ[0])
        values = {r: rows[r, column].item() for r in range(comm.world_size)}
        raise ValueError(
            f"{what} differs across the ranks of the tensor-parallel group: each rank must "
            f"shard the same dense model (fingerprint entry {column - 1} by group rank: {values})"
        )
