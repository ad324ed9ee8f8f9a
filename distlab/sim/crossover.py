"""The message size where one algorithm overtakes another (tree vs ring).

A tree all-reduce takes ``2 ceil(log2 n)`` latency steps, the ring ``2(n-1)``;
the ring moves ``2(n-1)/n N`` bytes per rank, the tree ``2 ceil(log2 n) N``.
So the tree wins small messages and the ring large ones. With both costs of
the form ``a alpha + b N beta + c N gamma`` (:mod:`distlab.sim.cost`) they
are equal at

    N* = (a_large - a_small) alpha / ((b_small - b_large) beta + (c_small - c_large) gamma)

Below ``N*`` the ``small`` algorithm is faster. :func:`crossover_size` gives
``N*`` from the closed forms, or by replaying both schedules on a cluster
(bisection on the size), where contention and two-level links count too.
"""

from __future__ import annotations

import math

from .algorithms import build_schedule, closed_form
from .replay import Topology, as_cluster, simulate
from .topology import Link

#: Largest size the replay search looks at (1 PiB).
MAX_BYTES = 2**50


def crossover_size(
    n: int,
    link_or_cluster: Topology,
    *,
    small: str = "tree_all_reduce",
    large: str = "ring_all_reduce",
    gamma: float = 0.0,
    method: str = "closed_form",
    itemsize: int = 4,
) -> float:
    """Bytes ``N*`` below which ``small`` beats ``large`` on ``n`` ranks.

    Returns ``0.0`` when ``small`` is never faster and ``math.inf`` when it
    always is. ``method="closed_form"`` needs a :class:`Link`;
    ``method="replay"`` takes a link, a :class:`ClusterSpec` or a preset name
    and returns a size on the ``itemsize`` grid (within one grid step).
    """
    if method == "closed_form":
        if not isinstance(link_or_cluster, Link):
            raise TypeError("method='closed_form' needs a Link; use method='replay' for a cluster")
        return _closed_form_crossover(n, link_or_cluster, small, large, gamma)
    if method == "replay":
        return _replay_crossover(n, link_or_cluster, small, large, gamma, itemsize)
    raise ValueError(f"method must be 'closed_form' or 'replay', got {method!r}")


def _closed_form_crossover(n: int, link: Link, small: str, large: str, gamma: float) -> float:
    s, g = closed_form(small, n), closed_form(large, n)
    latency_saved = (g.alpha_terms - s.alpha_terms) * link.alpha
    extra_per_byte = (s.beta_factor - g.beta_factor) * link.beta + (
        s.gamma_factor - g.gamma_factor
    ) * gamma
    # T_small - T_large = extra_per_byte * N - latency_saved: small wins where it is < 0.
    if extra_per_byte > 0:
        return max(latency_saved, 0.0) / extra_per_byte
    if latency_saved > 0 or (latency_saved == 0 and extra_per_byte < 0):
        return math.inf
    if extra_per_byte == 0:
        return 0.0
    raise ValueError(
        f"{small} wins large messages and {large} small ones here; swap small and large"
    )


def _replay_crossover(
    n: int, topology: Topology, small: str, large: str, gamma: float, itemsize: int
) -> float:
    cluster = as_cluster(topology, n)
    schedules = [
        build_schedule(name, n, ranks_per_node=cluster.gpus_per_node) for name in (small, large)
    ]
    # Sizes on a grid where every chunk of both schedules is equal, so both times are exact.
    grid = itemsize * math.lcm(*(s.n_chunks for s in schedules))

    def small_wins(units: int) -> bool:
        t_small, t_large = (
            simulate(s, cluster, units * grid, gamma=gamma).time_s for s in schedules
        )
        return t_small < t_large

    lo, hi = 1, MAX_BYTES // grid
    if not small_wins(lo):
        return 0.0
    if small_wins(hi):
        return math.inf
    while hi - lo > 1:  # small wins at lo, loses at hi
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if small_wins(mid) else (lo, mid)
    return float(hi * grid)
