"""Algorithm bandwidth, bus bandwidth, and the all-reduce bandwidth lower bound.

nccl-tests (``doc/PERFORMANCE.md`` in NVIDIA/nccl-tests) reports two rates for
a collective on ``n`` ranks that took ``t`` seconds on a buffer of ``N`` bytes:

* ``algbw = N / t``: the rate the application sees;
* ``busbw = algbw * factor``: the rate each rank's link had to sustain, so that
  numbers from different ``n`` and collectives compare with the hardware's
  peak. The factors (``n`` ranks):

  ===============  ==============
  all_reduce       2(n-1)/n
  reduce_scatter   (n-1)/n
  all_gather       (n-1)/n
  broadcast        1
  reduce           1
  all_to_all       (n-1)/n
  ===============  ==============

For all-reduce the factor comes from the bandwidth lower bound (Patarasuk &
Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", abstract; J. Parallel Distrib. Comput. 69(2)): every rank must send and
receive at least ``2(n-1)/n * N`` bytes, so no algorithm beats ``2(n-1)/n * N / B`` on
links of ``B`` bytes/s; ring all-reduce attains it, and its busbw equals ``B``.
"""

from __future__ import annotations

from fractions import Fraction

from distlab.core.collective_schedule import check_ranks

BUSBW_COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "all_to_all",
)


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio for ``collective`` on ``n`` ranks (table above)."""
    check_ranks(n)
    if collective == "all_reduce":
        return float(Fraction(2 * (n - 1), n))
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return float(Fraction(n - 1, n))
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; allowed: {BUSBW_COLLECTIVES}")


def algbw(n_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s: ``n_bytes / time_s``."""
    if time_s <= 0:
        raise ValueError(f"time_s must be > 0 seconds, got {time_s}")
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes}")
    return n_bytes / time_s


def busbw(collective: str, n: int, n_bytes: float, time_s: float) -> float:
    """Bus bandwidth in bytes/s: ``algbw * busbw_factor(collective, n)``."""
    return algbw(n_bytes, time_s) * busbw_factor(collective, n)


def all_reduce_lower_bound(n: int, n_bytes: float, bandwidth: float) -> float:
    """Fewest seconds any all-reduce of ``n_bytes`` on ``n`` ranks can take when
    each rank's link moves ``bandwidth`` bytes/s per direction:
    ``2(n-1)/n * n_bytes / bandwidth`` (Patarasuk & Yuan 2009, abstract; latency ignored)."""
    check_ranks(n)
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes}")
    return 2 * (n - 1) / n * n_bytes / bandwidth
