"""Closed-form alpha-beta-gamma costs of collective algorithms.

The model (Hockney 1994; used throughout Thakur, Rabenseifner & Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", IJHPCA
19(1)): a message of ``m`` bytes between two ranks costs ``alpha + m beta``
(latency ``alpha`` in s, ``beta`` = 1 / bandwidth in s/byte); reducing ``m``
bytes locally costs ``m gamma``. Every rank sends one message and receives
one message at a time, both at once (full duplex), on a uniform network
without contention. ``n`` ranks, ``N`` bytes in each rank's buffer.

Every algorithm's cost then has the form

    T(N) = a alpha + b N beta + c N gamma

and :class:`AlphaBetaCost` holds the three coefficients ``(a, b, c)``. The
functions below build them; :func:`distlab.sim.algorithms.closed_form` looks one up by the name the
schedule builders use (``"ring_all_reduce"``...). The replay in
:mod:`distlab.sim.replay` reproduces these numbers on a uniform topology
(tests/test_sim_cost.py), and adds what a formula cannot: contention and
two-level topologies.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.core.collective_schedule import check_ranks, log2_ceil

from .topology import Link


@dataclass(frozen=True)
class AlphaBetaCost:
    """``T(N) = alpha_terms * alpha + beta_factor * N * beta + gamma_factor * N * gamma``."""

    algorithm: str
    n: int
    alpha_terms: float
    beta_factor: float
    gamma_factor: float = 0.0

    def time(self, n_bytes: float, link: Link, gamma: float = 0.0) -> float:
        """Seconds for ``n_bytes`` on ``link`` (its alpha and beta), reduction at ``gamma`` s/byte.

        With ``n == 1`` nothing moves and the time is 0.
        """
        _check_bytes(n_bytes)
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0 seconds per byte, got {gamma}")
        return (
            self.alpha_terms * link.alpha
            + self.beta_factor * n_bytes * link.beta
            + self.gamma_factor * n_bytes * gamma
        )

    def __add__(self, other: AlphaBetaCost) -> AlphaBetaCost:
        """One algorithm run after the other on the same ``n`` ranks."""
        return AlphaBetaCost(
            f"{self.algorithm}+{other.algorithm}",
            self.n,
            self.alpha_terms + other.alpha_terms,
            self.beta_factor + other.beta_factor,
            self.gamma_factor + other.gamma_factor,
        )


# ---- ring -------------------------------------------------------------------


def ring_reduce_scatter_cost(n: int) -> AlphaBetaCost:
    """Ring reduce-scatter: ``(n-1) alpha + (n-1)/n N beta + (n-1)/n N gamma``.

    ``n - 1`` steps, each moving one ``N/n`` chunk per rank and reducing it
    (Thakur et al. 2005, Section 4, reduce-scatter for long messages).
    """
    check_ranks(n)
    return AlphaBetaCost("ring_reduce_scatter", n, n - 1, (n - 1) / n, (n - 1) / n)


def ring_all_gather_cost(n: int) -> AlphaBetaCost:
    """Ring all-gather: ``(n-1) alpha + (n-1)/n N beta`` (Thakur et al. 2005, Section 4,
    allgather ring)."""
    check_ranks(n)
    return AlphaBetaCost("ring_all_gather", n, n - 1, (n - 1) / n, 0.0)


def ring_all_reduce_cost(n: int) -> AlphaBetaCost:
    """Ring all-reduce = ring reduce-scatter + ring all-gather:
    ``2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma``.

    Its ``2(n-1)/n N`` bytes per rank meet the all-reduce lower bound, so the
    ring is bandwidth optimal (Patarasuk & Yuan 2009, abstract); its ``2(n-1)`` latency
    terms make it slow for small messages.
    """
    cost = ring_reduce_scatter_cost(n) + ring_all_gather_cost(n)
    return AlphaBetaCost(
        "ring_all_reduce", n, cost.alpha_terms, cost.beta_factor, cost.gamma_factor
    )


# ---- binomial trees -----------------------------------------------------------


def tree_reduce_cost(n: int) -> AlphaBetaCost:
    """Binomial-tree reduce: ``ceil(log2 n) (alpha + N beta + N gamma)``.

    Each round halves the ranks still holding partial sums; every message is
    the whole buffer (Thakur et al. 2005, Section 4, reduce for short messages).
    """
    k = log2_ceil(n)
    return AlphaBetaCost("tree_reduce", n, k, k, k)


def tree_broadcast_cost(n: int) -> AlphaBetaCost:
    """Binomial-tree broadcast: ``ceil(log2 n) (alpha + N beta)`` (Thakur et al. 2005, Section 4,
    broadcast for short messages)."""
    k = log2_ceil(n)
    return AlphaBetaCost("tree_broadcast", n, k, k, 0.0)


def tree_all_reduce_cost(n: int) -> AlphaBetaCost:
    """Binomial reduce to rank 0, then binomial broadcast:
    ``2 ceil(log2 n) (alpha + N beta) + ceil(log2 n) N gamma``."""
    cost = tree_reduce_cost(n) + tree_broadcast_cost(n)
    return AlphaBetaCost(
        "tree_all_reduce", n, cost.alpha_terms, cost.beta_factor, cost.gamma_factor
    )


def double_binary_tree_all_reduce_cost(n: int) -> AlphaBetaCost:
    """Double binary tree all-reduce as distlab's schedule plays it, for ``n = 2^k``:
    ``2k alpha + (2k - 1) N beta + (k - 1/2) N gamma``.

    Two binary trees (NCCL 2.4; Sanders, Speck & Träff 2009) each carry half
    the buffer, ``N/2``. Both trees have height ``k``. In every reduce round
    but the last, each inner node receives a half from each of its two
    children: ``N`` bytes on its in-port, ``alpha + N beta``. In the last round
    each root has one child: ``alpha + N/2 beta``. The broadcast mirrors this.
    The schedule does not pipeline; NCCL cuts each half into many small pieces
    so the rounds overlap, which keeps the latency logarithmic while the
    bandwidth term no longer grows with ``log n``. Other ``n``: replay the schedule.
    """
    check_ranks(n)
    if n & (n - 1):
        raise ValueError(
            f"the double binary tree closed form needs n a power of two, got n={n}; "
            "use distlab.sim.simulate on the schedule for other n"
        )
    k = log2_ceil(n)
    if k == 0:
        return AlphaBetaCost("double_binary_tree_all_reduce", n, 0, 0.0, 0.0)
    return AlphaBetaCost("double_binary_tree_all_reduce", n, 2 * k, 2 * k - 1, k - 0.5)


# ---- recursive halving and doubling (Rabenseifner) ----------------------------


def halving_doubling_all_reduce_cost(n: int) -> AlphaBetaCost:
    """Rabenseifner's all-reduce: recursive-halving reduce-scatter, then
    recursive-doubling all-gather (Thakur et al. 2005, Section 4.5, allreduce for long messages).

    For ``n = p`` a power of two: ``2 log2(p) alpha + 2(p-1)/p N beta + (p-1)/p N gamma``:
    the ring's bandwidth with logarithmic latency.

    Otherwise ``p`` is the largest power of two below ``n``: first ``n - p``
    ranks hand their whole buffer to a partner, which reduces it
    (``alpha + N beta + N gamma``); ``p`` ranks run the algorithm above; the
    partners copy the result back (``alpha + N beta``): in all
    ``+ 2 alpha + 2 N beta + N gamma``. Thakur et al. fold to a power of two in
    the same spirit; the formula counts distlab's schedule, which moves whole buffers.
    """
    check_ranks(n)
    p = 1 << (n.bit_length() - 1)
    k = p.bit_length() - 1
    a, b, c = 2 * k, 2 * (p - 1) / p, (p - 1) / p
    if p != n:
        a, b, c = a + 2, b + 2, c + 1
    return AlphaBetaCost("halving_doubling_all_reduce", n, a, b, c)


# ---- baselines and all-to-all ---------------------------------------------------


def naive_all_reduce_cost(n: int) -> AlphaBetaCost:
    """Parameter-server all-reduce: all send to rank 0 at once, rank 0 sends the sum back:
    ``2 alpha + 2(n-1) N beta + (n-1) N gamma`` (rank 0's port carries ``(n-1) N`` each way)."""
    check_ranks(n)
    if n == 1:
        return AlphaBetaCost("naive_all_reduce", n, 0, 0.0, 0.0)
    return AlphaBetaCost("naive_all_reduce", n, 2, 2 * (n - 1), n - 1)


def all_to_all_cost(n: int) -> AlphaBetaCost:
    """Pairwise-exchange all-to-all: ``(n-1) alpha + (n-1)/n N beta`` (Thakur et al.
    2005, Section 4.6, alltoall for long messages: in step ``k`` rank ``r`` sends to ``r + k``)."""
    check_ranks(n)
    return AlphaBetaCost("all_to_all", n, n - 1, (n - 1) / n, 0.0)


# ---- two levels -------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """One phase of a multi-level algorithm: ``cost`` on ``link``, on ``fraction * N`` bytes."""

    name: str
    cost: AlphaBetaCost
    link: Link
    fraction: float

    def time(self, n_bytes: float, gamma: float = 0.0) -> float:
        return self.cost.time(self.fraction * n_bytes, self.link, gamma)


@dataclass(frozen=True)
class PhasedCost:
    """A cost made of phases that run one after another (hierarchical all-reduce)."""

    algorithm: str
    phases: tuple[Phase, ...]

    def time(self, n_bytes: float, gamma: float = 0.0) -> float:
        return sum(phase.time(n_bytes, gamma) for phase in self.phases)

    def breakdown(self, n_bytes: float, gamma: float = 0.0) -> dict[str, float]:
        """Seconds per phase."""
        return {phase.name: phase.time(n_bytes, gamma) for phase in self.phases}


def hierarchical_all_reduce_cost(
    nodes: int,
    ranks_per_node: int,
    intra: Link,
    inter: Link,
    *,
    variant: str = "leader",
    nics_per_node: int | None = None,
) -> PhasedCost:
    """Two-level all-reduce on ``nodes`` nodes of ``k = ranks_per_node`` ranks.

    ``"leader"``: binomial reduce inside each node onto its first rank
    (``ceil(log2 k)(alpha_i + N beta_i + N gamma)``), ring all-reduce of the
    whole buffer among the ``m = nodes`` leaders (``2(m-1) alpha_e + 2(m-1)/m N beta_e
    + (m-1)/m N gamma``), binomial broadcast inside each node.

    ``"shard"`` (NCCL, Horovod; also UCC's "split rail"): ring reduce-scatter
    inside each node (``(k-1) alpha_i + (k-1)/k N beta_i``), then ``k`` ring
    all-reduces across nodes at once, each on an ``N/k`` shard, then a ring
    all-gather inside each node. The ``k`` concurrent shards share the node's
    ``nics_per_node`` NICs (default: one NIC per rank), so each sees
    ``inter.bandwidth / ceil(k / nics_per_node)``.

    Each phase is a closed form from this module (Thakur et al. 2005, Section 4, for
    the pieces); the two-level composition is the standard one, e.g. Horovod's
    hierarchical all-reduce (``HOROVOD_HIERARCHICAL_ALLREDUCE=1``).
    """
    check_ranks(nodes)
    check_ranks(ranks_per_node)
    k, m = ranks_per_node, nodes
    if variant == "leader":
        return PhasedCost(
            "hierarchical_all_reduce",
            (
                Phase("reduce inside nodes", tree_reduce_cost(k), intra, 1.0),
                Phase("all-reduce across leaders", ring_all_reduce_cost(m), inter, 1.0),
                Phase("broadcast inside nodes", tree_broadcast_cost(k), intra, 1.0),
            ),
        )
    if variant == "shard":
        nics = k if nics_per_node is None else nics_per_node
        check_ranks(nics)
        sharing = -(-k // nics)
        shared = (
            inter
            if sharing == 1
            else Link(f"{inter.name} shared by {sharing}", inter.alpha, inter.bandwidth / sharing)
        )
        return PhasedCost(
            "hierarchical_shard_all_reduce",
            (
                Phase("reduce-scatter inside nodes", ring_reduce_scatter_cost(k), intra, 1.0),
                Phase("all-reduce of shards across nodes", ring_all_reduce_cost(m), shared, 1 / k),
                Phase("all-gather inside nodes", ring_all_gather_cost(k), intra, 1.0),
            ),
        )
    raise ValueError(f"variant must be 'leader' or 'shard', got {variant!r}")


def _check_bytes(n_bytes: float) -> None:
    if not n_bytes >= 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
