"""The bytes and messages of one GPU's collectives, and their time on a link.

A step's traffic is a :class:`CommVolume`: a list of collectives, each a
:class:`CommPart` (or an :class:`AllToAllPart`). Bytes are counted the way a
ring algorithm moves them (Thakur, Rabenseifner & Gropp 2005, Section 4; Patarasuk & Yuan
2009): with K ranks and a buffer of n bytes,

* all-reduce: each GPU sends 2 (K-1)/K n bytes in 2 (K-1) messages;
* reduce-scatter and all-gather: (K-1)/K n bytes in K-1 messages
  (n is the full, unsharded buffer);
* broadcast (binomial tree, as distlab's ``tree_broadcast``): each of the K-1
  receivers gets n bytes once, so the K ranks send (K-1) n together, on
  average (K-1)/K n per GPU (the root sends ceil(log2 K) n, leaves nothing),
  in ceil(log2 K) sequential messages;
* all-to-all (pairwise exchange): (K-1)/K n bytes in K-1 messages;
* send/recv: n bytes in one message.

``.total`` is **bytes sent per GPU** (as many are received). The ZeRO paper
(Rajbhandari et al. 2020, Section 7) counts differently: an all-reduce of Ψ
elements moves 2Ψ, a reduce-scatter or all-gather Ψ, dropping (K-1)/K;
``.zero_paper_bytes`` gives that convention (DDP 2Ψ, ZeRO-1 and 2 also 2Ψ,
ZeRO-3 3Ψ: 1.5 times DDP).

What each parallelism sends is built from these parts in :mod:`distlab.calc.comm`
(DP, ZeRO, FSDP, TP, PP, CP), :mod:`distlab.calc.moe` (expert parallelism) and
:mod:`distlab.calc.three_d` (distlab's own TP x PP x DP run).
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.core.checks import choice
from distlab.sim.cost import (
    ring_all_gather_cost,
    ring_all_reduce_cost,
    ring_reduce_scatter_cost,
    tree_all_reduce_cost,
    tree_broadcast_cost,
)

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv")

#: the ring closed forms (distlab.sim.cost) whose bytes and steps a CommPart counts
_RING = {
    "all_reduce": ring_all_reduce_cost,
    "reduce_scatter": ring_reduce_scatter_cost,
    "all_gather": ring_all_gather_cost,
}


@dataclass(frozen=True)
class CommPart:
    """``count`` calls of one collective over ``group_size`` ranks on a
    buffer of ``payload_bytes`` (the full buffer, before any sharding)."""

    what: str
    collective: str
    group_size: int
    payload_bytes: float
    count: float = 1

    def __post_init__(self) -> None:
        choice("collective", self.collective, COLLECTIVES)

    @property
    def bytes_sent(self) -> float:
        """Bytes one GPU sends for all ``count`` calls (ring algorithms: the ``beta`` factor of
        :mod:`distlab.sim.cost`'s ring closed forms times the payload; a broadcast: the
        average over the K ranks, (K-1)/K of the payload)."""
        if self.collective == "send_recv":
            return self.payload_bytes * self.count
        if self.collective == "broadcast":
            k = self.group_size
            return (k - 1) / k * self.payload_bytes * self.count
        factor = _RING[self.collective](self.group_size).beta_factor
        return factor * self.payload_bytes * self.count

    @property
    def messages(self) -> float:
        """Sequential messages (each pays the latency alpha) for all calls, ring algorithms."""
        return self.latency_steps()

    def latency_steps(self, all_reduce: str = "ring") -> float:
        """Sequential messages for all calls. ``all_reduce="tree"`` counts a
        (double) binary tree all-reduce, 2 ceil(log2 K) steps, as NCCL uses at
        scale; ``"auto"`` the smaller of ring and tree. Other collectives are rings."""
        choice("all_reduce", all_reduce, ("ring", "tree", "auto"))
        k = self.group_size
        if k == 1:
            return 0
        if self.collective == "send_recv":
            return self.count
        if self.collective == "broadcast":
            return tree_broadcast_cost(k).alpha_terms * self.count  # ceil(log2 K)
        ring = _RING[self.collective](k).alpha_terms
        if self.collective != "all_reduce":
            return ring * self.count
        tree = tree_all_reduce_cost(k).alpha_terms  # 2 ceil(log2 K)
        steps = {"ring": ring, "tree": tree, "auto": min(ring, tree)}[all_reduce]
        return steps * self.count

    @property
    def zero_paper_bytes(self) -> float:
        """The ZeRO paper's count: all-reduce 2n, reduce-scatter/all-gather/send n."""
        if self.group_size == 1:
            return 0.0
        factor = 2 if self.collective == "all_reduce" else 1
        return factor * self.payload_bytes * self.count


@dataclass(frozen=True)
class CommVolume:
    """The collectives one GPU takes part in during a step; ``.total`` bytes sent."""

    name: str
    parts: tuple[CommPart, ...]

    @property
    def total(self) -> float:
        return sum(p.bytes_sent for p in self.parts)

    @property
    def zero_paper_bytes(self) -> float:
        return sum(p.zero_paper_bytes for p in self.parts)

    @property
    def messages(self) -> float:
        return sum(p.messages for p in self.parts)

    def time_on(self, link, *, all_reduce: str = "ring") -> float:
        """Seconds on ``link`` (a :class:`distlab.sim.topology.Link`), one
        collective after the other: messages x alpha + bytes / bandwidth.

        The bandwidth term is always the ring's (bandwidth-optimal); with
        ``all_reduce="tree"`` or ``"auto"`` all-reduces pay a tree's latency
        instead (see :meth:`CommPart.latency_steps`): a lower bound of what
        NCCL reaches by switching algorithm with message size.
        """
        steps = sum(p.latency_steps(all_reduce) for p in self.parts)
        return time_on_link(self.total, link, messages=steps)


def time_on_link(n_bytes: float, link, *, messages: float = 1) -> float:
    """Alpha-beta time (Hockney 1994): messages x link.alpha + n_bytes / link.bandwidth."""
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
    if messages < 0:
        raise ValueError(f"messages must be >= 0, got {messages!r}")
    return messages * link.alpha + n_bytes / link.bandwidth


@dataclass(frozen=True)
class AllToAllPart:
    """``count`` all-to-alls over ``group_size`` ranks of a ``payload_bytes`` buffer
    per rank (the whole buffer, its own block included).

    Pairwise exchange (Thakur, Rabenseifner & Gropp 2005, Section 4.6): each
    rank keeps its own block and sends the other ``K - 1`` blocks, so it
    sends ``(K-1)/K n`` bytes in ``K - 1`` messages per call. Has the same
    properties as :class:`CommPart`, so it can sit in a :class:`CommVolume`.
    """

    what: str
    group_size: int
    payload_bytes: float
    count: float = 1
    collective: str = "all_to_all"

    @property
    def bytes_sent(self) -> float:
        k = self.group_size
        return (k - 1) / k * self.payload_bytes * self.count

    @property
    def messages(self) -> float:
        return self.latency_steps()

    def latency_steps(self, all_reduce: str = "ring") -> float:
        return (self.group_size - 1) * self.count

    @property
    def zero_paper_bytes(self) -> float:
        return self.bytes_sent
