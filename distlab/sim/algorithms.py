"""Every collective algorithm distlab has, in one table, and the simulator's lookups by name.

One :class:`Algorithm` per algorithm joins three things that live on the floors
below: its schedule builder (data, pure Python, :mod:`distlab.collectives`), its
closed-form alpha-beta cost (:mod:`distlab.sim.cost`) and the function that runs
it on real processes (also :mod:`distlab.collectives`; torch is loaded when it is
first called). The benchmark, the simulator, the plots and the data-parallel
wrappers read this table instead of keeping their own lists::

    from distlab.sim.algorithms import REGISTRY, lookup
    ring = lookup("ring", "all_reduce")          # or REGISTRY["ring_all_reduce"]
    ring.schedule(8).n_steps, ring.cost(8).beta_factor
    ring.runner()(tensor)                        # inside distlab.run(...)

Names: an algorithm is ``<short>_<collective>`` (``"ring_all_reduce"``), as
the public functions are, except the one all-to-all algorithm (short name
``"pairwise"``), which is plain ``"all_to_all"``. The two hierarchical
all-reduces share one schedule builder and one runner, with
``variant="leader"`` or ``"shard"``. The CLI and the benchmark records name an
algorithm by ``(algorithm, collective)``, e.g. ``("ring", "all_reduce")``;
:func:`algorithm_name` turns one into the other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from distlab import collectives
from distlab.core.checks import positive_int
from distlab.core.collective_schedule import CollectiveSchedule

from . import cost
from .cost import AlphaBetaCost, PhasedCost, hierarchical_all_reduce_cost
from .topology import ClusterSpec

#: collectives with a root rank (their builders and runners take ``root``)
ROOTED = ("broadcast", "reduce")


@dataclass(frozen=True)
class Algorithm:
    """One algorithm for one collective."""

    short: str  # "ring", "tree", ..., "pairwise"
    collective: str  # "all_reduce", "reduce_scatter", ...
    builder: Callable[..., CollectiveSchedule]  # (n, ...) -> CollectiveSchedule
    cost: Callable[[int], AlphaBetaCost] | None  # closed form; None: two-level (see below)
    run: Callable  # the function of distlab.collectives that runs it (loads torch when called)
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

    def schedule(
        self, n: int, *, ranks_per_node: int | None = None, root: int = 0
    ) -> CollectiveSchedule:
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
        """The function that runs it on real processes (torch is loaded on its first call)."""
        return functools.partial(self.run, **self.options) if self.options else self.run


_ENTRIES = (
    Algorithm(
        "ring",
        "all_reduce",
        collectives.ring_all_reduce_schedule,
        cost.ring_all_reduce_cost,
        collectives.ring_all_reduce,
    ),
    Algorithm(
        "ring",
        "reduce_scatter",
        collectives.ring_reduce_scatter_schedule,
        cost.ring_reduce_scatter_cost,
        collectives.ring_reduce_scatter,
    ),
    Algorithm(
        "ring",
        "all_gather",
        collectives.ring_all_gather_schedule,
        cost.ring_all_gather_cost,
        collectives.ring_all_gather,
    ),
    Algorithm(
        "tree",
        "all_reduce",
        collectives.tree_all_reduce_schedule,
        cost.tree_all_reduce_cost,
        collectives.tree_all_reduce,
    ),
    Algorithm(
        "tree",
        "broadcast",
        collectives.tree_broadcast_schedule,
        cost.tree_broadcast_cost,
        collectives.tree_broadcast,
    ),
    Algorithm(
        "tree",
        "reduce",
        collectives.tree_reduce_schedule,
        cost.tree_reduce_cost,
        collectives.tree_reduce,
    ),
    Algorithm(
        "double_binary_tree",
        "all_reduce",
        collectives.double_binary_tree_all_reduce_schedule,
        cost.double_binary_tree_all_reduce_cost,
        collectives.double_binary_tree_all_reduce,
    ),
    Algorithm(
        "halving_doubling",
        "all_reduce",
        collectives.halving_doubling_all_reduce_schedule,
        cost.halving_doubling_all_reduce_cost,
        collectives.halving_doubling_all_reduce,
    ),
    Algorithm(
        "hierarchical",
        "all_reduce",
        collectives.hierarchical_all_reduce_schedule,
        None,
        collectives.hierarchical_all_reduce,
        {"variant": "leader"},
    ),
    Algorithm(
        "hierarchical_shard",
        "all_reduce",
        collectives.hierarchical_all_reduce_schedule,
        None,
        collectives.hierarchical_all_reduce,
        {"variant": "shard"},
    ),
    Algorithm(
        "naive",
        "all_reduce",
        collectives.naive_all_reduce_schedule,
        cost.naive_all_reduce_cost,
        collectives.naive_all_reduce,
    ),
    Algorithm(
        "pairwise",
        "all_to_all",
        collectives.all_to_all_schedule,
        cost.all_to_all_cost,
        collectives.all_to_all,
    ),
)

#: full name ("ring_all_reduce") -> Algorithm
REGISTRY: dict[str, Algorithm] = {a.name: a for a in _ENTRIES}

#: full name -> schedule builder ``(n, ...) -> CollectiveSchedule`` (the shard variant of the
#: hierarchical all-reduce is ``SCHEDULES["hierarchical_all_reduce"](n, k, "shard")``)
SCHEDULES = {a.name: a.builder for a in _ENTRIES if not a.options}
SCHEDULES["hierarchical_all_reduce"] = collectives.hierarchical_all_reduce_schedule

#: the one-level all-reduce algorithms by short name -> the function that runs them
#: (what DDP's ``algorithm=`` and the tests choose from)
ALL_REDUCE = {a.short: a.run for a in _ENTRIES if a.collective == "all_reduce" and not a.two_level}


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


def algorithm_names() -> list[str]:
    """Every algorithm name :func:`build_schedule` accepts."""
    return sorted(REGISTRY)


def algorithm_name(algorithm: str, collective: str) -> str:
    """``("ring", "all_reduce")`` -> ``"ring_all_reduce"``; all-to-all's only
    algorithm (``"pairwise"``) is plain ``"all_to_all"``."""
    return lookup(algorithm, collective).name


def _entry(name: str) -> Algorithm:
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(algorithm_names())}")
    return entry


def build_schedule(name: str, n: int, *, ranks_per_node: int | None = None) -> CollectiveSchedule:
    """The schedule of algorithm ``name`` on ``n`` ranks.

    The hierarchical all-reduces need ``ranks_per_node`` (ranks ``0..k-1`` on node 0, ...).
    """
    positive_int("number of ranks", n)
    return _entry(name).schedule(n, ranks_per_node=ranks_per_node)


def predicted_cost(name: str, n: int, cluster: ClusterSpec) -> AlphaBetaCost | PhasedCost:
    """The closed form of ``name`` on ``n`` ranks of ``cluster``.

    Hierarchical algorithms get a :class:`PhasedCost` over the cluster's intra
    and inter links; the others an :class:`AlphaBetaCost` (use it with one link).
    """
    entry = _entry(name)
    if not entry.two_level:
        return closed_form(name, n)
    k = min(cluster.gpus_per_node, n)
    if n % k:
        raise ValueError(f"{name}: {n} ranks do not fill nodes of {k} GPUs")
    return hierarchical_all_reduce_cost(
        n // k,
        k,
        cluster.intra,
        cluster.inter,
        variant=entry.options["variant"],
        nics_per_node=cluster.nics_per_node,
    )


def closed_form(algorithm: str, n: int) -> AlphaBetaCost:
    """The closed-form cost of ``algorithm`` (a name such as ``"ring_all_reduce"``) on ``n`` ranks.

    Read from :data:`REGISTRY`, whose entries point at the functions of :mod:`distlab.sim.cost`. Single-level algorithms only; see
    :func:`hierarchical_all_reduce_cost` for two levels.
    """
    entry = REGISTRY.get(algorithm)
    if entry is None or entry.cost is None:
        known = sorted(name for name, a in REGISTRY.items() if a.cost is not None)
        raise ValueError(f"no closed form for {algorithm!r}; known: {known}")
    return entry.cost(n)
