"""Every collective algorithm distlab has, in one table.

One :class:`Algorithm` per algorithm: its names, the schedule builder (data,
pure Python), the closed-form alpha-beta cost (:mod:`distlab.sim.cost`) and
the function that runs it on real processes (torch, imported when first
called). The benchmark, the simulator, the plots and the data-parallel
wrappers read this table instead of keeping their own lists::

    from distlab.collectives.registry import REGISTRY, lookup
    ring = lookup("ring", "all_reduce")          # or REGISTRY["ring_all_reduce"]
    ring.schedule(8).n_steps, ring.cost(8).beta_factor
    ring.runner()(tensor)                        # inside distlab.run(...)

Names: an algorithm is ``<short>_<collective>`` (``"ring_all_reduce"``), as
the public functions are, except the one all-to-all algorithm (short name
``"pairwise"``), which is plain ``"all_to_all"``. The two hierarchical
all-reduces share one schedule builder and one runner, with
``variant="leader"`` or ``"shard"``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from distlab.sim import cost as _cost

from .all_to_all import all_to_all_schedule
from .halving_doubling import halving_doubling_all_reduce_schedule
from .hierarchical import hierarchical_all_reduce_schedule
from .naive import naive_all_reduce_schedule
from .ring import ring_all_gather_schedule, ring_all_reduce_schedule, ring_reduce_scatter_schedule
from .schedule import Schedule
from .tree import (
    double_binary_tree_all_reduce_schedule,
    tree_all_reduce_schedule,
    tree_broadcast_schedule,
    tree_reduce_schedule,
)

#: collectives with a root rank (their builders and runners take ``root``)
ROOTED = ("broadcast", "reduce")


@dataclass(frozen=True)
class Algorithm:
    """One algorithm for one collective."""

    short: str  # "ring", "tree", ..., "pairwise"
    collective: str  # "all_reduce", "reduce_scatter", ...
    builder: Callable[..., Schedule]  # (n, ...) -> Schedule
    cost: Callable[[int], _cost.AlphaBetaCost] | None  # closed form; None: two-level, see sim
    runner_name: str  # the function in distlab.collectives that runs it
    options: dict = field(default_factory=dict)  # fixed keyword arguments (variant)

    @property
    def name(self) -> str:
        if self.collective == "all_to_all":
            return "all_to_all"
        return f"{self.short}_{self.collective}"

    @property
    def two_level(self) -> bool:
        """True for the hierarchical algorithms, which need ``ranks_per_node``."""
        return self.short.startswith("hierarchical")

    def schedule(self, n: int, *, ranks_per_node: int | None = None, root: int = 0) -> Schedule:
        """The schedule on ``n`` ranks (``ranks_per_node`` for two-level ones, ``root`` for
        broadcast and reduce)."""
        if self.two_level:
            if ranks_per_node is None:
                raise ValueError(f"{self.name} needs ranks_per_node (GPUs per node)")
            return self.builder(n, ranks_per_node, **self.options)
        if self.collective in ROOTED:
            return self.builder(n, root)
        return self.builder(n)

    def runner(self) -> Callable:
        """The torch function that runs it (imports torch on first use)."""
        module = importlib.import_module("distlab.collectives")
        function = getattr(module, self.runner_name)
        return functools.partial(function, **self.options) if self.options else function


_ENTRIES = (
    Algorithm("ring", "all_reduce", ring_all_reduce_schedule, _cost.ring_all_reduce_cost,
              "ring_all_reduce"),
    Algorithm("ring", "reduce_scatter", ring_reduce_scatter_schedule,
              _cost.ring_reduce_scatter_cost, "ring_reduce_scatter"),
    Algorithm("ring", "all_gather", ring_all_gather_schedule, _cost.ring_all_gather_cost,
              "ring_all_gather"),
    Algorithm("tree", "all_reduce", tree_all_reduce_schedule, _cost.tree_all_reduce_cost,
              "tree_all_reduce"),
    Algorithm("tree", "broadcast", tree_broadcast_schedule, _cost.tree_broadcast_cost,
              "tree_broadcast"),
    Algorithm("tree", "reduce", tree_reduce_schedule, _cost.tree_reduce_cost, "tree_reduce"),
    Algorithm("double_binary_tree", "all_reduce", double_binary_tree_all_reduce_schedule,
              _cost.double_binary_tree_all_reduce_cost, "double_binary_tree_all_reduce"),
    Algorithm("halving_doubling", "all_reduce", halving_doubling_all_reduce_schedule,
              _cost.halving_doubling_all_reduce_cost, "halving_doubling_all_reduce"),
    Algorithm("hierarchical", "all_reduce", hierarchical_all_reduce_schedule, None,
              "hierarchical_all_reduce", {"variant": "leader"}),
    Algorithm("hierarchical_shard", "all_reduce", hierarchical_all_reduce_schedule, None,
              "hierarchical_all_reduce", {"variant": "shard"}),
    Algorithm("naive", "all_reduce", naive_all_reduce_schedule, _cost.naive_all_reduce_cost,
              "naive_all_reduce"),
    Algorithm("pairwise", "all_to_all", all_to_all_schedule, _cost.all_to_all_cost,
              "all_to_all"),
)  # fmt: skip

#: full name ("ring_all_reduce") -> Algorithm
REGISTRY: dict[str, Algorithm] = {a.name: a for a in _ENTRIES}


def lookup(short: str, collective: str) -> Algorithm:
    """``lookup("ring", "all_reduce")``: the entry, or ``ValueError`` naming the known ones."""
    for entry in _ENTRIES:
        if entry.short == short and entry.collective == collective:
            return entry
    known = ", ".join(algorithms_for(collective)) or "none"
    raise ValueError(
        f"no algorithm {short!r} for collective {collective!r}; known for it: {known} "
        f"(all: {', '.join(REGISTRY)})"
    )


def algorithms_for(collective: str) -> list[str]:
    """Short names of the algorithms for ``collective``, in table order."""
    return [a.short for a in _ENTRIES if a.collective == collective]


def collectives() -> list[str]:
    """The collectives some algorithm implements, in table order."""
    return list(dict.fromkeys(a.collective for a in _ENTRIES))
