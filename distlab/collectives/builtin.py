"""torch.distributed's own collectives, under the names the installed torch has.

torch 2.13 renamed the single-tensor all-gather and reduce-scatter
(``all_gather_into_tensor`` -> ``all_gather_single``, ``reduce_scatter_tensor`` ->
``reduce_scatter_single``) and warns (``FutureWarning``) on every call of an old name;
torch before 2.13 has only the old names, and distlab runs on torch >= 2.4. This module is
the one place that knows both: the benchmarks and the agreement check call the built-ins
through it, and an exercise that replaces torch's collectives withholds every name
:func:`collectives` lists, so a learner cannot reach one under its other name.
"""

from __future__ import annotations

from collections.abc import Callable

#: Every collective of ``torch.distributed`` (point-to-point ops and barriers are not),
#: old names and new; :func:`collectives` keeps those the installed torch has.
COLLECTIVE_NAMES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
)


def all_gather_single() -> Callable:
    """``all_gather_single(output, input, group=None)`` (torch >= 2.13), else its old name
    ``all_gather_into_tensor``: every rank's ``input`` concatenated into ``output``."""
    import torch.distributed as dist

    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_single() -> Callable:
    """``reduce_scatter_single(output, input, op=SUM, group=None)`` (torch >= 2.13), else
    its old name ``reduce_scatter_tensor``: block ``r`` of the reduced ``input`` on rank ``r``."""
    import torch.distributed as dist

    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def collectives() -> tuple[Callable, ...]:
    """The functions :data:`COLLECTIVE_NAMES` names, those the installed torch has."""
    import torch.distributed as dist

    return tuple(getattr(dist, name) for name in COLLECTIVE_NAMES if hasattr(dist, name))
