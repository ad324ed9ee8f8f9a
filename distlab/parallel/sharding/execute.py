"""Run a sharded-matmul plan on real processes and count the bytes each rank sends.

:func:`run_plan` runs on one rank (inside ``distlab.run``): it takes the rank's blocks of
``A`` and ``B``, plays the plan's steps with distlab's ring collectives
(:mod:`distlab.parallel.tensor.ops` along a dimension, through a
:class:`~distlab.parallel.tensor.ops.TensorParallelComm`), and returns the rank's block of
``C``. :func:`measure_plans` launches the ranks, runs each plan on the same operands under
:func:`~distlab.collectives.count_traffic`, and compares each rank's block of ``C`` with
the block of the dense product it should hold.

The operands hold small integers (-4..4) in float32: every product and every partial sum
is an integer far below 2^24, so any order of summation gives the same bits, and a plan's
result equals the dense ``A @ B`` exactly (error 0), not merely to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distlab.collectives import count_traffic
from distlab.launch import run
from distlab.parallel.tensor import ops
from distlab.parallel.tensor.ops import TensorParallelComm

from .notation import Sharded, one_axis_mesh
from .plans import Plan


@dataclass(frozen=True)
class PlanMeasurement:
    """One plan run on ``n`` ranks: the largest |block - dense block| over the ranks (inf if a
    rank's block has the wrong shape), the bytes each rank sent (counted on the wire) and the
    bytes the formula gives."""

    plan: Plan
    max_error: float
    bytes_sent: tuple[int, ...]
    formula_bytes: float

    @property
    def matches(self) -> bool:
        """Exact result on every rank, and every rank sent what the formula says."""
        return self.max_error == 0 and all(b == self.formula_bytes for b in self.bytes_sent)


def block_of(full: torch.Tensor, sharding: Sharded, rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s block of ``full`` under ``sharding`` on a one-axis mesh of ``n`` ranks:
    block ``rank`` of every split dimension, all of every whole one."""
    block = full
    for index, dim in enumerate(sharding.dims):
        if dim.mesh_axis is not None:
            block = block.chunk(n, index)[rank]
    return block.contiguous()


def run_plan(
    plan: Plan, a_block: torch.Tensor, b_block: torch.Tensor, comm: TensorParallelComm
) -> torch.Tensor:
    """This rank's block of ``C``: ``plan``'s steps on this rank's blocks of ``A`` and ``B``,
    every collective over ``comm``'s group (the mesh axis)."""
    held = {plan.a.name: a_block, plan.b.name: b_block}
    current = {plan.a.name: plan.a, plan.b.name: plan.b}
    for step in plan.steps:
        if step.op == "matmul":
            held[step.tensor] = held[plan.a.name] @ held[plan.b.name]
        else:
            x, where = held[step.tensor], current[step.tensor]
            label = f"{step.op} {step.tensor}"
            if step.op == "all_reduce":
                held[step.tensor] = ops.all_reduce(x, comm, "forward", label)
            elif step.op == "all_gather":
                dim = where.index_of(step.dim)
                held[step.tensor] = ops.all_gather(x, dim, comm, "forward", label)
            elif step.op == "reduce_scatter":
                dim = step.result.index_of(step.dim)
                held[step.tensor] = ops.reduce_scatter(x, dim, comm, "forward", label)
            elif step.op == "slice":
                held[step.tensor] = ops.my_slice(x, where.index_of(step.dim), comm)
            else:
                raise ValueError(f"unknown step {step.op!r} in {plan}")
        current[step.tensor] = step.result
    return held[plan.out.name]


def operands(plan: Plan, sizes: dict[str, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole ``A`` (I x J) and ``B`` (J x K) of small integers in float32, the same in every
    process for the same ``seed``."""
    (i, j), k = plan.a.names, plan.b.names[1]
    generator = torch.Generator().manual_seed(seed)
    a = torch.randint(-4, 5, (sizes[i], sizes[j]), generator=generator).float()
    b = torch.randint(-4, 5, (sizes[j], sizes[k]), generator=generator).float()
    return a, b


def _measure_on_rank(rank: int, world_size: int, jobs, seed: int) -> list[tuple[float, int]]:
    torch.set_num_threads(1)
    results = []
    for plan, sizes in jobs:
        a, b = operands(plan, sizes, seed)
        comm = TensorParallelComm(algorithm="ring")
        a_block = block_of(a, plan.a, rank, world_size)
        b_block = block_of(b, plan.b, rank, world_size)
        with count_traffic() as traffic:
            c_block = run_plan(plan, a_block, b_block, comm)
        want = block_of(a @ b, plan.out, rank, world_size)
        same_shape = c_block.shape == want.shape  # else: the plan left the wrong block
        error = (c_block - want).abs().max().item() if same_shape else float("inf")
        results.append((error, traffic.bytes_sent))
    return results


def measure_plans(
    plans: list[Plan],
    sizes: dict[str, int] | list[dict[str, int]],
    mesh: dict[str, int],
    *,
    seed: int = 0,
) -> list[PlanMeasurement]:
    """Run every plan (one launch, ``n`` ranks for a mesh ``{axis: n}``) on operands of
    ``sizes`` (one dict for all plans, or one per plan); one :class:`PlanMeasurement` per
    plan, in order. The plans' byte counts must have been made for those sizes and 4-byte
    elements (float32)."""
    _, n = one_axis_mesh(mesh)
    per_plan = sizes if isinstance(sizes, list) else [sizes] * len(plans)
    if len(per_plan) != len(plans):
        raise ValueError(f"{len(plans)} plans but {len(per_plan)} dicts of sizes")
    per_rank = run(_measure_on_rank, n, args=(list(zip(plans, per_plan)), seed))
    measured = []
    for index, plan in enumerate(plans):
        errors, sent = zip(*(rank_results[index] for rank_results in per_rank))
        measured.append(PlanMeasurement(plan, max(errors), tuple(sent), plan.bytes_per_rank))
    return measured
