"""The device mesh: every process group of a TP x CP x PP x DP (x EP) job, by name.

A job's ranks form one grid (:func:`distlab.core.ranks.rank_groups`,
Megatron-core's order ``tp-cp-ep-dp-pp``: tensor parallelism innermost, so its
ranks are consecutive, pipeline stages outermost)::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

A dimension's process groups are the grid's lines along that axis.
:func:`build_mesh` creates all of them once (every rank must create every group,
in the same order, even those it is not in: ``torch.distributed.new_group``
is collective) and keeps this rank's, so code reads like torch's
``DeviceMesh``::

    mesh = build_mesh(tp=2, pp=2)          # dp = world / (tp * cp * pp)
    mesh["tp"]                             # this rank's tensor-parallel group
    mesh.coordinates                       # {"tp": 1, "cp": 0, "dp": 0, "pp": 1, ...}
    mesh.ranks("dp"), mesh.next_stage_rank # its global ranks; the next pipeline stage

Names: ``"tp"``, ``"cp"``, ``"dp"``, ``"pp"``, ``"dp-cp"`` (where gradients are
averaged when cp > 1), ``"ep"`` and ``"expert_dp"``. Expert parallelism does
not multiply the world size (Megatron-core): the MoE layers re-split the
``dp * cp`` ranks into ``ep`` expert-parallel ranks times ``dp * cp / ep``
expert-data-parallel ranks, which average the experts' gradients.

The same rank lists come out of ``torch.distributed.device_mesh.init_device_mesh``
with the shape listed slowest first, ``(pp, dp, cp, tp)`` (see
:meth:`distlab.core.layout.Layout.device_mesh_shape`); tests/test_parallel_mesh.py checks it.
"""

from __future__ import annotations

import torch.distributed as dist

from distlab.core.layout import Layout
from distlab.core.ranks import DEFAULT_ORDER, GROUP_NAMES
from distlab.parallel.comm.trace import name_groups


class ParallelMesh:
    """This rank's view of a :class:`~distlab.core.layout.Layout`, with a process group per name."""

    def __init__(self, layout: Layout, rank: int, process_groups: dict) -> None:
        self.layout, self.rank, self._groups = layout, rank, process_groups

    def __getitem__(self, name: str):
        """The process group ``name`` of this rank (pass it as ``group=``)."""
        if name not in self._groups:
            raise KeyError(f"no group {name!r}; the mesh has {list(GROUP_NAMES)}")
        return self._groups[name]

    def ranks(self, name: str) -> list[int]:
        """The global ranks of this rank's ``name`` group, in group-rank order."""
        return self.layout.group_of(name, self.rank)

    def size(self, name: str) -> int:
        return len(self.ranks(name))

    @property
    def coordinates(self) -> dict[str, int]:
        return self.layout.coordinates(self.rank)

    @property
    def is_first_stage(self) -> bool:
        return self.coordinates["pp"] == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coordinates["pp"] == self.layout.pp - 1

    @property
    def next_stage_rank(self) -> int | None:
        """Global rank of the next pipeline stage (same tp, cp, dp coordinates); None at the end."""
        stages, stage = self.ranks("pp"), self.coordinates["pp"]
        return None if self.is_last_stage else stages[stage + 1]

    @property
    def prev_stage_rank(self) -> int | None:
        """Global rank of the previous pipeline stage; None at the first."""
        stages, stage = self.ranks("pp"), self.coordinates["pp"]
        return None if self.is_first_stage else stages[stage - 1]

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={self.size(n)}" for n in ("tp", "cp", "ep", "dp", "pp"))
        return f"ParallelMesh(rank={self.rank}, {dims}, coordinates={self.coordinates})"


def build_mesh(
    layout: Layout | None = None, *, tp=1, cp=1, pp=1, ep=1, dp=None, order=DEFAULT_ORDER
) -> ParallelMesh:
    """Create every process group of the job and return this rank's :class:`ParallelMesh`.

    Pass a :class:`~distlab.core.layout.Layout` (its world size must be the
    job's), or the degrees (``dp`` defaults to world / (tp * cp * pp)). Call it on
    every rank (inside ``distlab.run``). Identical rank lists (e.g. ``"dp-cp"``
    and ``"dp"`` when cp = 1) share one process group.
    """
    if not dist.is_initialized():
        raise RuntimeError("no process group: call build_mesh inside distlab.run(...)")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if layout is None:
        layout = Layout.for_world(world_size, tp=tp, cp=cp, pp=pp, ep=ep, dp=dp, order=order)
    elif not isinstance(layout, Layout):
        raise TypeError(f"layout must be a distlab Layout, got {type(layout).__name__}")
    elif layout.world_size != world_size:
        raise ValueError(
            f"{layout.label()} needs {layout.world_size} ranks, but the job has {world_size}"
        )
    created: dict[tuple[int, ...], object] = {}
    mine = {}
    for name in GROUP_NAMES:
        for ranks in layout.groups[name]:
            key = tuple(ranks)
            if key not in created:
                created[key] = dist.group.WORLD if len(key) == world_size else dist.new_group(key)
            if rank in ranks:
                mine[name] = created[key]
    name_groups(mine)  # an open trace_comm names its calls "tp", "dp", ...
    return ParallelMesh(layout, rank, mine)
