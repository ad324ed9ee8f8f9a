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
:meth:`MeshLayout.device_mesh_shape`); tests/test_parallel_mesh.py checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from distlab.core.ranks import DEFAULT_ORDER, GROUP_NAMES, rank_groups
from distlab.parallel.comm_trace import name_groups


@dataclass(frozen=True)
class MeshLayout:
    """The rank lists of every group; pure Python, no process group needed."""

    world_size: int
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1
    order: str = DEFAULT_ORDER
    groups: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups = rank_groups(
            self.world_size, tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp, ep=self.ep,
            order=self.order,
        )  # fmt: skip
        object.__setattr__(self, "groups", groups)

    @classmethod
    def for_world(cls, world_size: int, *, tp=1, cp=1, pp=1, ep=1, dp=None, order=DEFAULT_ORDER):
        """``dp`` defaults to ``world_size / (tp * cp * pp)`` (an error if that is not whole)."""
        if dp is None:
            model_parallel = tp * cp * pp
            if not isinstance(model_parallel, int) or world_size % model_parallel:
                raise ValueError(
                    f"world_size={world_size} is not divisible by tp*cp*pp={model_parallel} "
                    f"(tp={tp}, cp={cp}, pp={pp}); choose degrees whose product divides it"
                )
            dp = world_size // model_parallel
        return cls(world_size, tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, order=order)

    def group_of(self, name: str, rank: int) -> list[int]:
        """The global ranks of the ``name`` group that contains ``rank``."""
        if name not in self.groups:
            raise KeyError(f"no group {name!r}; the mesh has {list(GROUP_NAMES)}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} does not exist; allowed: 0..{self.world_size - 1}")
        return next(g for g in self.groups[name] if rank in g)

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s index in each of its groups, e.g. ``{"tp": 1, "dp": 0, ...}``."""
        return {name: self.group_of(name, rank).index(rank) for name in GROUP_NAMES}

    def device_mesh_shape(self, expert: bool = False) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """``(mesh_shape, mesh_dim_names)`` for ``init_device_mesh`` giving the same groups.

        Only for the default order. Dense layers: ``(pp, dp, cp, tp)``; the
        experts' grid (``expert=True``): ``(pp, expert_dp, ep, tp)``.
        """
        if self.order != DEFAULT_ORDER:
            raise ValueError(
                f"only order {DEFAULT_ORDER!r} maps to one device mesh, not {self.order!r}"
            )
        if expert:
            expert_dp = self.cp * self.dp // self.ep
            return (self.pp, expert_dp, self.ep, self.tp), ("pp", "expert_dp", "ep", "tp")
        return (self.pp, self.dp, self.cp, self.tp), ("pp", "dp", "cp", "tp")


class ParallelMesh:
    """This rank's view of a :class:`MeshLayout`, with a process group per name."""

    def __init__(self, layout: MeshLayout, rank: int, process_groups: dict) -> None:
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


def build_mesh(*, tp=1, cp=1, pp=1, ep=1, dp=None, order=DEFAULT_ORDER) -> ParallelMesh:
    """Create every process group of the job and return this rank's :class:`ParallelMesh`.

    Call it on every rank (inside ``distlab.run``). Identical rank lists
    (e.g. ``"dp-cp"`` and ``"dp"`` when cp = 1) share one process group.
    """
    if not dist.is_initialized():
        raise RuntimeError("no process group: call build_mesh inside distlab.run(...)")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    layout = MeshLayout.for_world(world_size, tp=tp, cp=cp, pp=pp, ep=ep, dp=dp, order=order)
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
