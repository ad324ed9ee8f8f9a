"""One layout: every degree and setting of a parallel training run, validated once.

A job on ``tp * cp * pp * dp`` ranks is described by one :class:`Layout`, the
same object whichever part of distlab looks at it:

* the planner (:mod:`distlab.calc.planner`) ranks layouts by estimated step time;
* the placer (:mod:`distlab.placement`) maps a layout's groups onto machines;
* the runner (:func:`distlab.parallel.parallelize`, :func:`distlab.parallel.train`)
  builds its process groups (:func:`distlab.parallel.compose.mesh.build_mesh`) and applies
  each parallelism to a plain model.

The degrees (Megatron-core's names and rank order, see :mod:`distlab.core.ranks`)::

    tp   tensor parallelism: each layer's matrices split over tp ranks (innermost)
    cp   context parallelism: each sequence split over cp ranks
    ep   expert parallelism: the MoE layers' experts split over ep ranks; ep
         re-splits the cp * dp ranks and does not multiply the world size
    dp   data parallelism: dp replicas, each on b / dp of the batch
    pp   pipeline parallelism: the layers cut into pp stages (outermost)

    world_size = tp * cp * dp * pp

and the settings that go with them: how the data-parallel ranks keep the model
state (``zero_stage`` 0 = plain DDP, 1 = ZeRO-1 optimizer state, 2 = ZeRO-2
+ gradients, 3 = ZeRO-3 / FSDP + parameters; Rajbhandari et al. 2020,
Section 5), the pipeline ``schedule`` with ``virtual_stages`` model chunks per
rank and ``micro_batches`` per step, ``sequence_parallel`` (Korthikanti et al.
2022: LayerNorm and dropout on s / tp tokens per rank), ``recompute`` (activation
recomputation) and ``micro_batch`` (sequences per micro-batch, for the
calculators).

Every value is checked here, once, with a message that names it; code that
receives a ``Layout`` trusts it. The fields are keyword-only; counts are ints
(a whole float such as ``2.0`` is stored as ``2``, :func:`~distlab.core.checks.int_in`'s
rule; ``True``, ``2.5`` and ``"2"`` are refused); each degree and the world size
are at most :data:`MAX_WORLD_SIZE`; ``order`` names all five dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from distlab.core.checks import int_in, positive_int
from distlab.core.pipeline_schedule import GENERATORS, LOOPING
from distlab.core.ranks import (
    DEFAULT_ORDER,
    DIMENSIONS,
    GROUP_NAMES,
    check_degrees,
    parse_order,
    rank_groups,
)

#: The most ranks a layout may have (and so the largest degree): 2^18 = 262,144 GPUs, more
#: than the largest training clusters built so far; a bigger number is a typo, not a job.
MAX_WORLD_SIZE = 2**18
#: The fields that are degrees, each in 1..MAX_WORLD_SIZE.
DEGREES = ("tp", "cp", "ep", "pp", "dp", "virtual_stages")

#: activation recomputation: none, the attention core only (Korthikanti et al.
#: 2022, Section 4), or every layer's input only (Chen et al. 2016)
RECOMPUTE_MODES = ("none", "selective", "full")

#: what zero_stage means for the data-parallel ranks
ZERO_STAGES = {
    0: "DDP: every rank keeps the whole model state, gradients all-reduced",
    1: "ZeRO-1: optimizer state sharded over dp",
    2: "ZeRO-2: optimizer state and gradients sharded over dp",
    3: "ZeRO-3 / FSDP: optimizer state, gradients and parameters sharded over dp",
}


def check_order(order: object) -> str:
    """``order`` as a rank order naming each of tp, cp, ep, dp, pp once (first name varies
    fastest), lower-cased, e.g. ``"tp-cp-ep-dp-pp"``; a ``ValueError`` names an unknown,
    repeated or missing dimension (a partial order would leave the missing ones' place to
    a guess)."""
    if order == DEFAULT_ORDER and isinstance(order, str):
        return order  # every Layout checks its order: the planner builds thousands
    names = parse_order(order)  # TypeError for a non-string, ValueError for unknown/repeated
    given = [name.strip().lower() for name in str(order).split("-")]
    missing = [name for name in DIMENSIONS if name not in given]
    if missing:
        raise ValueError(
            f"order {order!r} leaves out {', '.join(missing)}; name every dimension once, "
            f"first the fastest-varying, e.g. {DEFAULT_ORDER!r}"
        )
    return "-".join(names)


def _degree(name: str, value: object) -> int:
    """``value`` as an int in 1..MAX_WORLD_SIZE (:func:`~distlab.core.checks.positive_int`'s
    rule and words below, the limit named above)."""
    degree = positive_int(name, value)
    if degree > MAX_WORLD_SIZE:
        raise ValueError(
            f"{name}={degree} is more than {MAX_WORLD_SIZE:,}, the largest degree (and world "
            f"size) a layout may have; allowed: {name} in 1..{MAX_WORLD_SIZE}"
        )
    return degree


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The degrees and settings of one parallel run; see the module docstring.

    ``schedule=None`` means "1f1b", or "interleaved" when ``virtual_stages > 1``.
    Construct it with keywords (positional arguments are a ``TypeError``):
    ``Layout(tp=2, pp=2, dp=2, zero_stage=1)``.
    """

    tp: int = 1
    cp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1
    zero_stage: int = 0
    virtual_stages: int = 1
    micro_batches: int = 1
    micro_batch: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    schedule: str | None = None
    order: str = DEFAULT_ORDER

    def __post_init__(self) -> None:
        checked = {name: _degree(name, getattr(self, name)) for name in DEGREES}
        checked["micro_batches"] = positive_int("micro_batches", self.micro_batches)
        checked["micro_batch"] = positive_int("micro_batch", self.micro_batch)
        checked["zero_stage"] = int_in("zero_stage", self.zero_stage, 0, 3)
        checked["order"] = check_order(self.order)
        for name, value in checked.items():  # 2.0 is stored as 2, "TP-..." as "tp-..."
            object.__setattr__(self, name, value)
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"tp*cp*dp*pp = {self.tp}*{self.cp}*{self.dp}*{self.pp} = {self.world_size:,} "
                f"ranks is more than the {MAX_WORLD_SIZE:,} ranks a layout may have"
            )
        check_degrees(self.world_size, tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep)
        if not isinstance(self.sequence_parallel, bool):
            raise TypeError(
                f"sequence_parallel must be True or False, got {self.sequence_parallel!r}"
            )
        if self.sequence_parallel and self.tp == 1:
            raise ValueError(
                "sequence_parallel=True needs tp >= 2: it splits the tp group's tokens"
            )
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {self.recompute!r}")
        if self.schedule is not None and (
            not isinstance(self.schedule, str) or self.schedule not in GENERATORS
        ):
            allowed = ", ".join(GENERATORS)
            raise ValueError(f"unknown schedule {self.schedule!r}; allowed: {allowed}")
        if self.virtual_stages > 1 and self.pp == 1:
            raise ValueError(
                f"virtual_stages={self.virtual_stages} needs pp >= 2: "
                "one pipeline stage has nothing to interleave"
            )
        if self.virtual_stages > 1 and self.schedule not in (None, *LOOPING):
            allowed = " or ".join(map(repr, LOOPING))
            raise ValueError(
                f"virtual_stages={self.virtual_stages} needs a schedule with model chunks "
                f"looping round the ranks ({allowed}), not {self.schedule!r}"
            )

    @classmethod
    def for_world(cls, world_size: int, **settings) -> Layout:
        """The layout with ``dp = world_size / (tp * cp * pp)``, or a ``ValueError`` naming
        the degrees when that is not whole."""
        world_size = positive_int("world_size", world_size)
        if settings.get("dp") is None:
            model_parallel = 1
            for name in ("tp", "cp", "pp"):
                model_parallel *= positive_int(name, settings.get(name, 1))
            if world_size % model_parallel:
                raise ValueError(
                    f"world_size={world_size} is not divisible by tp*cp*pp={model_parallel}; "
                    "choose degrees whose product divides it"
                )
            settings["dp"] = world_size // model_parallel
        layout = cls(**settings)
        if layout.world_size != world_size:
            raise ValueError(
                f"{layout.label()} needs {layout.world_size} ranks, not world_size={world_size}"
            )
        return layout

    @property
    def world_size(self) -> int:
        """tp * cp * dp * pp ranks (ep re-splits cp * dp and is not a factor)."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def pipeline_schedule(self) -> str:
        """The schedule's name: ``schedule``, or its default."""
        if self.schedule is not None:
            return self.schedule
        return "interleaved" if self.virtual_stages > 1 else "1f1b"

    @property
    def fsdp(self) -> bool:
        """ZeRO-3: parameters sharded over dp too (FSDP)."""
        return self.zero_stage == 3

    def with_(self, **changes) -> Layout:
        """A copy with ``changes`` applied (and validated)."""
        return replace(self, **changes)

    @cached_property
    def groups(self) -> dict[str, list[list[int]]]:
        """Every group's rank lists by name (:func:`distlab.core.ranks.rank_groups`),
        e.g. ``layout.groups["dp"]``; computed once per layout."""
        return rank_groups(
            self.world_size, tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp, ep=self.ep,
            order=self.order,
        )  # fmt: skip

    def group_of(self, name: str, rank: int) -> list[int]:
        """The global ranks of the ``name`` group that holds ``rank``."""
        if name not in GROUP_NAMES:
            raise KeyError(f"no group {name!r}; a layout has {list(GROUP_NAMES)}")
        int_in("rank", rank, 0, self.world_size - 1)
        return next(g for g in self.groups[name] if rank in g)

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s index in each of its groups, e.g. ``{"tp": 1, "cp": 0, "dp": 0, ...}``."""
        int_in("rank", rank, 0, self.world_size - 1)
        return {n: self.group_of(n, rank).index(rank) for n in GROUP_NAMES}

    def device_mesh_shape(self, expert: bool = False) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """``(mesh_shape, mesh_dim_names)`` for torch's ``init_device_mesh`` giving the
        same groups (default order only). Dense layers: ``(pp, dp, cp, tp)``; the
        experts' grid (``expert=True``): ``(pp, expert_dp, ep, tp)``."""
        if self.order != DEFAULT_ORDER:
            raise ValueError(
                f"only order {DEFAULT_ORDER!r} maps to one device mesh, not {self.order!r}"
            )
        if expert:
            expert_dp = self.cp * self.dp // self.ep
            return (self.pp, expert_dp, self.ep, self.tp), ("pp", "expert_dp", "ep", "tp")
        return (self.pp, self.dp, self.cp, self.tp), ("pp", "dp", "cp", "tp")

    def label(self) -> str:
        """A short name, e.g. ``"TP2(SP) x PP2 x DP2 ZeRO-1 interleaved v=2 m=4"``:
        degrees above 1 only (``"1 rank"`` when all are 1), then the settings that are set."""
        parts = []
        for name in ("tp", "cp", "ep", "pp", "dp"):
            value = getattr(self, name)
            if value > 1:
                sp = "(SP)" if name == "tp" and self.sequence_parallel else ""
                parts.append(f"{name.upper()}{value}{sp}")
        text = " x ".join(parts) or "1 rank"
        if self.zero_stage:
            text += " FSDP" if self.fsdp else f" ZeRO-{self.zero_stage}"
        if self.pp > 1:
            text += f" {self.pipeline_schedule}"
            text += f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        if self.micro_batches > 1:
            text += f" m={self.micro_batches}"
        if self.recompute != "none":
            text += f" recompute={self.recompute}"
        return text


def check_layout(value: object) -> Layout:
    """``value`` if it is a :class:`Layout`, else a ``TypeError`` that shows what it got
    (the calculators, the planner and the placer take a layout this way)."""
    if not isinstance(value, Layout):
        raise TypeError(f"layout must be a distlab.core.layout.Layout, got {value!r}")
    return value
