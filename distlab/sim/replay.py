"""Replay a collective's schedule on a modelled cluster: time, bytes per link, busbw.

A :class:`~distlab.core.collective_schedule.CollectiveSchedule` says, step by step, which
rank sends which chunks to which rank. The replay puts each step's messages
on the cluster at once (:meth:`ClusterSpec.route` says which ports each one
occupies) and charges, per step:

* every port ``p`` carries ``L_p`` bytes in this step and moves
  ``bandwidth_p`` bytes/s, so it is busy for ``L_p / bandwidth_p`` seconds
  (concurrent messages share it);
* a message ends after its route's latency plus the time of the busiest port
  on its way: ``alpha + max_p L_p / bandwidth_p`` (and, optionally, plus
  ``gamma`` times the bytes its receiver reduces in this step);
* the step ends when its slowest message ends; steps run one after another.

On a uniform network (:func:`~distlab.sim.topology.uniform_cluster`) every
rank's port carries one message per step and this is exactly the alpha-beta
model of :mod:`distlab.sim.cost`. Charging a port's whole load to each message
on it is what fair sharing gives the *last* message to finish, which is the
one that ends the step; it ignores that small messages may finish early.

Pure Python, no torch: only the schedule data type is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distlab.core.checks import int_in, positive_int
from distlab.core.collective_schedule import CollectiveSchedule, chunk_bounds

from .bandwidth import busbw_factor
from .topology import ClusterSpec, Link, Route, preset, uniform_cluster

Topology = ClusterSpec | Link | str


@dataclass(frozen=True)
class SimResult:
    """What one replay measured. Times in seconds, bandwidths in bytes/s (GB/s = 1e9 B/s)."""

    collective: str
    algorithm: str
    world_size: int
    n_bytes: int
    cluster: str
    time_s: float
    step_times_s: tuple[float, ...]
    step_bottlenecks: tuple[str, ...]  # the port that limited each step's slowest message
    bytes_per_link_class: dict[str, int]  # "nvlink", "pcie", "pcie-far", "bus", "network"
    bytes_per_port: dict[str, int]  # e.g. "gpu3 out", "node0 nic7 out"
    bytes_sent_per_rank: tuple[int, ...]
    algbw: float
    busbw: float

    @property
    def algbw_GBps(self) -> float:
        return self.algbw / 1e9

    @property
    def busbw_GBps(self) -> float:
        return self.busbw / 1e9


def as_cluster(cluster_or_topology: Topology, world_size: int) -> ClusterSpec:
    """A :class:`ClusterSpec` from a spec, a preset name, or a single :class:`Link`
    (meaning ``world_size`` GPUs on an ideal switch of that link)."""
    if isinstance(cluster_or_topology, ClusterSpec):
        return cluster_or_topology
    if isinstance(cluster_or_topology, str):
        return preset(cluster_or_topology)
    if isinstance(cluster_or_topology, Link):
        return uniform_cluster(world_size, cluster_or_topology)
    raise TypeError(
        f"cluster_or_topology must be a ClusterSpec, a preset name or a Link, "
        f"got {type(cluster_or_topology).__name__}"
    )


def chunk_sizes_bytes(n_bytes: int, n_chunks: int, itemsize: int = 4) -> list[int]:
    """Bytes in each chunk when ``n_bytes`` of ``itemsize``-byte elements are cut
    like the executor cuts them (:func:`~distlab.core.collective_schedule.chunk_bounds`)."""
    _check_size(n_bytes, itemsize)
    return [(hi - lo) * itemsize for lo, hi in chunk_bounds(n_bytes // itemsize, n_chunks)]


def simulate(
    schedule: CollectiveSchedule,
    cluster_or_topology: Topology,
    n_bytes: int,
    placement: Sequence[int] | None = None,
    *,
    itemsize: int = 4,
    gamma: float = 0.0,
) -> SimResult:
    """Replay ``schedule`` on a buffer of ``n_bytes`` per rank (see module docstring).

    ``cluster_or_topology``: a :class:`ClusterSpec`, a preset name, or a
    :class:`Link` (a uniform network of ``schedule.world_size`` ranks).
    ``placement[r]`` is the GPU that rank ``r`` runs on (default: GPU ``r``).
    ``itemsize``: bytes per element, so chunks split like the real buffer.
    ``gamma``: seconds per byte to reduce received data (0: reductions are free).
    """
    cluster = as_cluster(cluster_or_topology, schedule.world_size)
    gpus = _placement(schedule.world_size, cluster, placement)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0 seconds per byte, got {gamma}")
    sizes = chunk_sizes_bytes(n_bytes, schedule.n_chunks, itemsize)
    replayer = _StepReplayer(cluster, gpus, sizes, gamma)
    # Steps with the same messages (same src, dst, number of chunks, reduce) cost
    # the same when all chunks are equal: a ring has 2(n-1) such steps, so each
    # distinct step is replayed once and counted (this keeps n in the thousands fast).
    same_sizes = len(set(sizes)) == 1
    outcomes: dict[tuple, StepOutcome] = {}
    repeats: dict[tuple, int] = {}  # how often each distinct step occurs
    step_times, bottlenecks = [], []
    for i, step in enumerate(schedule.steps):
        key = tuple([(t.src, t.dst, len(t.chunks), t.reduce) for t in step]) if same_sizes else i
        outcome = outcomes.get(key)
        if outcome is None:
            outcome = outcomes[key] = replayer.step(step)
        repeats[key] = repeats.get(key, 0) + 1
        step_times.append(outcome.time_s)
        bottlenecks.append(outcome.bottleneck)

    bytes_per_port: dict[str, int] = {}
    per_class: dict[str, int] = {}
    sent = [0] * schedule.world_size
    for key, outcome in outcomes.items():
        repeat = repeats[key]
        for totals, counts in (
            (bytes_per_port, outcome.port_bytes),
            (per_class, outcome.class_bytes),
        ):
            for name, size in counts.items():
                totals[name] = totals.get(name, 0) + repeat * size
        for rank, size in outcome.sent.items():
            sent[rank] += repeat * size

    total = sum(step_times)
    alg = n_bytes / total if total > 0 else float("inf")  # one rank: nothing to move
    factor = busbw_factor(schedule.collective, schedule.world_size)
    return SimResult(
        collective=schedule.collective,
        algorithm=schedule.algorithm,
        world_size=schedule.world_size,
        n_bytes=n_bytes,
        cluster=cluster.name,
        time_s=total,
        step_times_s=tuple(step_times),
        step_bottlenecks=tuple(bottlenecks),
        bytes_per_link_class=per_class,
        bytes_per_port=bytes_per_port,
        bytes_sent_per_rank=tuple(sent),
        algbw=alg,
        busbw=alg * factor if factor else 0.0,
    )


@dataclass(frozen=True)
class StepOutcome:
    """One step's replay: its time, the port that limited it, and the bytes moved."""

    time_s: float
    bottleneck: str
    port_bytes: dict[str, int]
    class_bytes: dict[str, int]
    sent: dict[int, int]


class _StepReplayer:
    """Replays single steps on one cluster, caching each rank pair's route."""

    def __init__(self, cluster: ClusterSpec, gpus: list[int], sizes: list[int], gamma: float):
        self.cluster, self.gpus, self.gamma = cluster, gpus, gamma
        self.prefix = [0]
        for size in sizes:
            self.prefix.append(self.prefix[-1] + size)
        self.routes: dict[tuple[int, int], Route] = {}
        self.bandwidth: dict[str, float] = {}  # port -> bytes/s

    def route(self, src: int, dst: int) -> Route:
        route = self.routes.get((src, dst))
        if route is None:
            route = self.routes[(src, dst)] = self.cluster.route(self.gpus[src], self.gpus[dst])
            self.bandwidth.update(route.ports)
        return route

    def step(self, step) -> StepOutcome:
        prefix = self.prefix
        load: dict[str, int] = {}  # bytes on each port in this step
        reduced: dict[int, int] = {}  # bytes each receiver reduces in this step
        class_bytes: dict[str, int] = {}
        sent: dict[int, int] = {}
        messages = []
        for t in step:
            size = prefix[t.chunks[-1] + 1] - prefix[t.chunks[0]]
            if size == 0 or t.src == t.dst:  # nothing to send, or a local copy
                continue
            route = self.route(t.src, t.dst)
            for port, _ in route.ports:
                load[port] = load.get(port, 0) + size
            if t.reduce:
                reduced[t.dst] = reduced.get(t.dst, 0) + size
            messages.append((route, t.dst, t.reduce))
            sent[t.src] = sent.get(t.src, 0) + size
            class_bytes[route.kind] = class_bytes.get(route.kind, 0) + size

        busy = {port: size / self.bandwidth[port] for port, size in load.items()}
        step_time, slowest = 0.0, None
        for route, dst, reduces in messages:
            end = route.alpha + max(busy[port] for port, _ in route.ports)
            if reduces and self.gamma:
                end += self.gamma * reduced[dst]
            if end > step_time:
                step_time, slowest = end, route
        bottleneck = max(slowest.ports, key=lambda p: busy[p[0]])[0] if slowest else ""
        return StepOutcome(step_time, bottleneck, load, class_bytes, sent)


def _placement(world_size: int, cluster: ClusterSpec, placement: Sequence[int] | None) -> list[int]:
    if world_size > cluster.world_size:
        raise ValueError(
            f"the schedule has {world_size} ranks but cluster {cluster.name!r} has only "
            f"{cluster.world_size} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node}); "
            f"use more nodes, e.g. preset({cluster.name!r}, nodes=...)"
        )
    if placement is None:
        return list(range(world_size))
    gpus = list(placement)
    if len(gpus) != world_size:
        raise ValueError(f"placement has {len(gpus)} entries; the schedule has {world_size} ranks")
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"placement puts two ranks on one GPU: {gpus}")
    for g in gpus:
        int_in(f"placement's GPU (cluster {cluster.name!r})", g, 0, cluster.world_size - 1)
    return gpus


def _check_size(n_bytes: int, itemsize: int) -> None:
    positive_int("itemsize (bytes)", itemsize)
    positive_int("n_bytes", n_bytes)
    if n_bytes % itemsize:
        raise ValueError(f"n_bytes={n_bytes} is not a whole number of {itemsize}-byte elements")
