"""What every collective engine works on: chunks of a buffer, reduce ops and process groups.

A schedule (:mod:`distlab.core.collective_schedule`) names chunks by index; :class:`Chunks`
maps those indices to tensors. :func:`op_name` and :func:`combine_` are the reduction
(``dst = op(dst, received)``); :func:`group_info` and :func:`global_rank` translate ranks
inside a process group to the global ranks ``torch.distributed`` sends to. Both engines
(:mod:`~distlab.collectives.executor` and :mod:`~distlab.collectives.pipelined`) use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import torch
import torch.distributed as dist

from distlab.core.collective_schedule import chunk_bounds

SUPPORTED_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
)

_OP_NAMES = ("sum", "avg", "product", "max", "min")


def op_name(op) -> str:
    """Normalise ``op`` (a ``torch.distributed.ReduceOp`` or a string) to a name.

    Raises ``ValueError`` naming the op and the allowed ones.
    """
    if op is None:
        return "sum"
    if isinstance(op, str):
        name = op.lower()
    else:
        name = next((n for n in _OP_NAMES if op == getattr(dist.ReduceOp, n.upper())), None)
    if name not in _OP_NAMES:
        raise ValueError(f"unsupported reduce op {op!r}; allowed: ReduceOp.SUM/AVG/PRODUCT/MAX/MIN")
    return name


def combine_(dst: torch.Tensor, src: torch.Tensor, op: str) -> None:
    """``dst = op(dst, src)`` in place. AVG sums here; the caller divides once at the end."""
    if op in ("sum", "avg"):
        dst.add_(src)
    elif op == "product":
        dst.mul_(src)
    elif op == "max":
        torch.maximum(dst, src, out=dst)
    elif op == "min":
        torch.minimum(dst, src, out=dst)
    else:  # pragma: no cover - op_name() already rejected it
        raise ValueError(op)


def finish_average_(tensor: torch.Tensor, op: str, world_size: int) -> None:
    """Turn a SUM into an AVG (only for the ranks that hold a result)."""
    if op == "avg" and tensor.numel():
        tensor.div_(world_size)


# ---------------------------------------------------------------- buffers ----
class Chunks:
    """The pieces a schedule's chunk indices refer to.

    Either one flat tensor cut at ``bounds`` (a run of chunks is then one
    contiguous slice, sent as one message), or a list of separate tensors,
    one per chunk (all-to-all).
    """

    def __init__(self, pieces: Sequence[torch.Tensor], flat=None, bounds=None):
        self.pieces = list(pieces)
        self.flat = flat
        self.bounds = bounds

    @classmethod
    def of_flat(cls, flat: torch.Tensor, bounds: Sequence[tuple[int, int]]) -> Chunks:
        flat = flat.view(-1)
        return cls([flat[a:b] for a, b in bounds], flat, list(bounds))

    @classmethod
    def split(cls, flat: torch.Tensor, n_chunks: int) -> Chunks:
        """Cut ``flat`` into ``n_chunks`` near-equal pieces (:func:`chunk_bounds`)."""
        return cls.of_flat(flat, chunk_bounds(flat.numel(), n_chunks))

    @classmethod
    def of_list(cls, tensors: Sequence[torch.Tensor]) -> Chunks:
        return cls([t.view(-1) for t in tensors])

    def region(self, chunk_ids: Sequence[int]) -> list[torch.Tensor]:
        """Tensors covering ``chunk_ids`` (a contiguous run): one slice when flat."""
        if self.flat is not None:
            start, stop = self.bounds[chunk_ids[0]][0], self.bounds[chunk_ids[-1]][1]
            return [self.flat[start:stop]]
        return [self.pieces[c] for c in chunk_ids]


# ----------------------------------------------------------------- groups ----
#: The ``group`` argument of every collective and wrapper, as in torch.distributed's own
#: signatures: a process group (from ``dist.new_group`` or a mesh), or None for all ranks.
Group: TypeAlias = dist.ProcessGroup | None


def group_info(group: Group) -> tuple[int, int]:
    """(rank in group, group size); a clear error when no process group exists, or when
    the calling rank is not in ``group``."""
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group: call inside distlab.run(...) or after distlab.init() / "
            "torch.distributed.init_process_group()"
        )
    rank = dist.get_rank(group)
    if rank < 0:  # torch's own collectives return at once here, leaving the group waiting
        raise ValueError(
            f"global rank {dist.get_rank()} is not a member of the process group it passed: "
            "torch.distributed.new_group(ranks) gives the ranks it leaves out a placeholder "
            "(GroupMember.NON_GROUP_MEMBER); call the collective on the group's ranks only"
        )
    return rank, dist.get_world_size(group)


def global_rank(group: Group, rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)
