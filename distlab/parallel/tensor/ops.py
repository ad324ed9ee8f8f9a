"""The communication operators of tensor parallelism, as tiny autograd functions.

Megatron-LM (Shoeybi et al. 2019, Section 3, Figure 3; Narayanan et al. 2021,
Section 2.3) splits a layer's weights across the ``t`` ranks of a
tensor-parallel group and needs only two conjugate operators::

            forward              backward
    f       identity             all-reduce      (before a column-parallel layer)
    g       all-reduce           identity        (after a row-parallel layer)

and, where a tensor changes from split to whole, the split/gather pair::

    split   keep my slice        all-gather the gradient slices
    gather  all-gather slices    keep my slice of the gradient

Sequence parallelism (Korthikanti et al. 2022, Section 4.2.2) replaces each
all-reduce by an all-gather plus a reduce-scatter along the sequence; those
operators live in :mod:`distlab.parallel.tensor.sequence` and use the same
:class:`TensorParallelComm`.

Every collective goes through :class:`TensorParallelComm`, a
:class:`~distlab.parallel.comm.collectives.Collectives` (distlab's own algorithms or
``"builtin"``) that also logs each call: which collective, forward or
backward, and where in the model, so tests and plots can count them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.parallel.comm.collectives import Collectives


@dataclass(frozen=True)
class CommEvent:
    """One collective call: ``phase`` ("forward"/"backward"), ``collective``,
    ``where`` (a label such as "attention out") and ``elements`` (full buffer)."""

    phase: str
    collective: str
    where: str
    elements: int


@dataclass
class TensorParallelComm(Collectives):
    """The collectives of one tensor-parallel group, with a log of every call.

    ``TensorParallelComm(algorithm="ring", group=tp_group)``; ``group=None``
    is the whole world. Raises ``ValueError`` on a rank that is not in ``group``.
    """

    log: list = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rank < 0:
            members = dist.get_process_group_ranks(self.group)
            raise ValueError(
                f"rank {dist.get_rank()} is not in the tensor-parallel group {members}: "
                f"build the layers only on the group's ranks"
            )

    def record(self, phase: str, collective: str, where: str, tensor: torch.Tensor) -> None:
        self.log.append(CommEvent(phase, collective, where, tensor.numel()))

    def count(self, phase: str | None = None, collective: str | None = None) -> int:
        """How many logged calls match ``phase`` and ``collective`` (None: any)."""
        return sum(
            1 for e in self.log if phase in (None, e.phase) and collective in (None, e.collective)
        )

    def reset(self) -> None:
        """Forget the log and the counters (e.g. after construction)."""
        self.log.clear()
        self.calls.clear()
        self.elements.clear()


# ------------------------------------------------ collectives along a dimension
def all_reduce(x: torch.Tensor, comm: TensorParallelComm, phase: str, where: str) -> torch.Tensor:
    """A new tensor: the sum of ``x`` over the group."""
    out = x.contiguous().clone()
    comm.record(phase, "all_reduce", where, out)
    comm.all_reduce_sum_(out)
    return out


def all_gather(
    x: torch.Tensor, dim: int, comm: TensorParallelComm, phase: str, where: str
) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``, in rank order."""
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((comm.world_size * moved.shape[0], *moved.shape[1:]))
    comm.record(phase, "all_gather", where, out)
    comm.all_gather(out, moved)
    return out.movedim(0, dim).contiguous()


def reduce_scatter(
    x: torch.Tensor, dim: int, comm: TensorParallelComm, phase: str, where: str
) -> torch.Tensor:
    """Sum ``x`` over the group and keep this rank's 1/t slice along ``dim``."""
    moved = x.movedim(dim, 0).contiguous()
    size = moved.shape[0]
    if size % comm.world_size:
        raise ValueError(
            f"dimension {dim} of size {size} must be divisible by the group size "
            f"{comm.world_size} to reduce-scatter along it"
        )
    out = moved.new_empty((size // comm.world_size, *moved.shape[1:]))
    comm.record(phase, "reduce_scatter", where, moved)
    comm.reduce_scatter_sum(out, moved)
    return out.movedim(0, dim).contiguous()


def my_slice(x: torch.Tensor, dim: int, comm: TensorParallelComm) -> torch.Tensor:
    """This rank's 1/t slice of ``x`` along ``dim`` (no communication)."""
    return x.chunk(comm.world_size, dim)[comm.rank].contiguous()


# ------------------------------------------------------------- the operators
class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward (Shoeybi et al. 2019, Section 3, Figure 3).

    Placed before a column-parallel layer: every rank uses the whole input
    X, and the gradient dL/dX = sum over ranks of each rank's dX_i::

        forward   X ──► X (every rank)       backward   Σ_i dX_i ◄── dX_i
    """

    @staticmethod
    def forward(ctx, x, comm: TensorParallelComm, where: str):
        ctx.comm, ctx.where = comm, where
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.comm, "backward", ctx.where), None, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce forward, identity backward (Shoeybi et al. 2019, Section 3, Figure 3).

    Placed after a row-parallel layer: Y = sum over ranks of the partial
    products Y_i = X_i B_i; the gradient of each Y_i is dL/dY itself::

        forward   Σ_i Y_i ◄── Y_i            backward   dY ──► dY (every rank)
    """

    @staticmethod
    def forward(ctx, x, comm: TensorParallelComm, where: str):
        return all_reduce(x, comm, "forward", where)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class SplitToTensorParallel(torch.autograd.Function):
    """split: keep this rank's slice of the last dimension forward, all-gather
    the gradient slices backward (Megatron-LM's ``scatter_to_tensor_model_parallel_region``;
    Narayanan et al. 2021, Section 2.3)."""

    @staticmethod
    def forward(ctx, x, comm: TensorParallelComm, where: str):
        ctx.comm, ctx.where = comm, where
        return my_slice(x, -1, comm)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, -1, ctx.comm, "backward", ctx.where), None, None


class GatherFromTensorParallel(torch.autograd.Function):
    """gather: all-gather the slices of the last dimension forward, keep this
    rank's slice of the gradient backward (the conjugate of split; Megatron-LM's
    ``gather_from_tensor_model_parallel_region``)."""

    @staticmethod
    def forward(ctx, x, comm: TensorParallelComm, where: str):
        ctx.comm = comm
        return all_gather(x, -1, comm, "forward", where)

    @staticmethod
    def backward(ctx, grad):
        return my_slice(grad, -1, ctx.comm), None, None


def copy_to_tp(x, comm, where="input"):
    return CopyToTensorParallel.apply(x, comm, where)


def reduce_from_tp(x, comm, where="output"):
    return ReduceFromTensorParallel.apply(x, comm, where)


def split_to_tp(x, comm, where="split"):
    return SplitToTensorParallel.apply(x, comm, where)


def gather_from_tp(x, comm, where="gather"):
    return GatherFromTensorParallel.apply(x, comm, where)
