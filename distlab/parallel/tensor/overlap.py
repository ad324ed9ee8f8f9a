"""The collective matmul: a sequence-parallel all-gather hidden behind the matmul it feeds.

With sequence parallelism (:mod:`distlab.parallel.tensor.sequence`) each of the t ranks
of a tensor-parallel group holds s/t tokens, ``X_r``; a column-parallel layer needs every
token, so it all-gathers them first and then multiplies by its column shard ``W``::

    Y = AllGather(X_0, ..., X_{t-1}) @ W            (s x n/t on every rank)

:func:`serial_gather_matmul` does exactly that: while the gather runs, the rank waits.
But row block j of Y needs only ``X_j``: ``Y = [X_0 W; X_1 W; ...]``. So the gather can
be decomposed into its t chunks and pipelined with the matmuls
(:func:`overlapped_gather_matmul`): the chunks travel round a ring, rank r sending the
chunk it holds to r+1 and receiving the next from r-1, and while a chunk is in flight the
rank multiplies the one it already has::

    step j:  isend(chunk, r+1), irecv(next, r-1)   |   Y[(r-j) mod t] = chunk @ W   |   wait

After t steps every rank has seen every chunk, t-1 transfers of s/t x k elements each,
the bytes of a ring all-gather; only the last wait of each step is exposed. This is the
"collective matmul" of Wang et al. 2023, "Overlap Communication with Dependent
Computation via Decomposition in Large Deep Learning Models" (ASPLOS), also written out
with ``ppermute`` in the JAX shard_map documentation; Megatron-LM and Transformer Engine
overlap the same way on GPUs (there, the bidirectional ring halves the steps).

The mirror image is the row-parallel layer's output: ``ReduceScatter(X_r @ W_r)`` along
the sequence. :func:`serial_matmul_reduce_scatter` multiplies, then reduce-scatters;
:func:`overlapped_matmul_reduce_scatter` passes partial sums round the ring: at step j
rank r computes its contribution to chunk (r+j+1) mod t while the running sum of that
chunk is on its way from rank r+1, adds it, and sends it on to r-1; after t steps rank r
holds chunk r of the full sum.

Each function returns ``(y, timeline)``: a :class:`Timeline` of this rank's
``"compute"`` and ``"comm"`` intervals (:func:`distlab.parallel.comm.collectives.now` seconds; a
``"comm"`` interval runs from posting the operation to its wait returning, so it is when
the data *may* be moving). :func:`exposed_communication_seconds` is the time inside comm
intervals and outside every compute interval: what communication adds to the run.
Forward only; on gloo the transfers run on gloo's own threads while the matmul runs on
torch's, which is what lets them overlap on a CPU. :func:`distlab.viz.overlap.plot_overlap`
draws the timelines.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.parallel.comm.collectives import now

KINDS = ("compute", "comm")


@dataclass(frozen=True)
class Interval:
    """One span of work on one rank: ``kind`` ``"compute"`` or ``"comm"``, from ``start``
    to ``end`` seconds, with a ``label`` ("chunk 2 @ W", "recv chunk 1")."""

    kind: str
    start: float
    end: float
    label: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.start <= self.end:
            raise ValueError(
                f"interval {self.label!r} ends ({self.end}) before it starts ({self.start})"
            )

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """What one rank did, in the order it recorded it: a list of :class:`Interval`."""

    rank: int
    intervals: list[Interval] = field(default_factory=list)

    def add(self, kind: str, start: float, end: float, label: str = "") -> Interval:
        interval = Interval(kind, start, end, label)
        self.intervals.append(interval)
        return interval

    @contextmanager
    def record(self, kind: str, label: str = "") -> Iterator[None]:
        """Time the ``with`` body as one interval of ``kind``."""
        start = now()
        yield
        self.add(kind, start, now(), label)

    def of_kind(self, kind: str) -> list[Interval]:
        return [i for i in self.intervals if i.kind == kind]

    @property
    def start(self) -> float:
        return min(i.start for i in self.intervals)

    @property
    def end(self) -> float:
        return max(i.end for i in self.intervals)

    def busy_seconds(self, kind: str) -> float:
        """Length of the union of this kind's intervals (overlapping ones counted once)."""
        return _length(_union(self.of_kind(kind)))

    def shifted(self, origin: float) -> Timeline:
        """The same timeline with ``origin`` moved to time 0."""
        return Timeline(
            self.rank,
            [Interval(i.kind, i.start - origin, i.end - origin, i.label) for i in self.intervals],
        )


def _union(intervals: list[Interval]) -> list[tuple[float, float]]:
    """Disjoint, sorted (start, end) spans covering ``intervals``."""
    spans: list[tuple[float, float]] = []
    for i in sorted(intervals, key=lambda i: i.start):
        if spans and i.start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], i.end))
        else:
            spans.append((i.start, i.end))
    return spans


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length where two sorted, disjoint span lists overlap."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlapped_communication_seconds(timeline: Timeline) -> float:
    """Time spent communicating *and* computing: communication hidden behind compute."""
    comm = _union(timeline.of_kind("comm"))
    return _intersection(comm, _union(timeline.of_kind("compute")))


def exposed_communication_seconds(timeline: Timeline) -> float:
    """Time spent communicating while not computing: the union of the comm intervals
    minus its overlap with the union of the compute intervals."""
    return timeline.busy_seconds("comm") - overlapped_communication_seconds(timeline)


# ------------------------------------------------------------------------ helpers


def _ring(group) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank of the next, of the previous rank)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(f"rank {dist.get_rank()} is not in the group it was given")

    def global_rank(r: int) -> int:
        return r if group is None else dist.get_global_rank(group, r)

    return rank, size, global_rank((rank + 1) % size), global_rank((rank - 1) % size)


def _check(x: torch.Tensor, weight: torch.Tensor, dim: int) -> int:
    """``dim`` as a non-negative index; it must not be ``x``'s last (contracted) dimension."""
    if weight.dim() != 2:
        raise ValueError(
            f"weight must be a matrix (in_features, out_features), got shape {tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"x has {x.shape[-1]} features in its last dimension but weight expects "
            f"{weight.shape[0]}"
        )
    d = dim % x.dim()
    if d == x.dim() - 1:
        raise ValueError(
            f"dim={dim} is the contracted (feature) dimension of x; shard the sequence or "
            "batch instead"
        )
    return d


def _barrier(group) -> None:
    """Line the ranks up so that neither version's first wait measures start-up skew."""
    dist.barrier(group=group)


# ------------------------------------------------------ all-gather, then column matmul


def serial_gather_matmul(
    x_shard: torch.Tensor, weight: torch.Tensor, group=None, *, dim: int = 0
) -> tuple[torch.Tensor, Timeline]:
    """``AllGather(x_shard along dim) @ weight``: gather everything, then multiply.

    ``x_shard`` is this rank's slice of the sequence (``dim``, default 0), ``weight`` its
    column shard ``(in_features, out_features / t)``. Returns ``(y, timeline)``; ``y`` has
    every rank's tokens, in rank order, times this rank's columns.
    """
    d = _check(x_shard, weight, dim)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    timeline = Timeline(rank)
    moved = x_shard.movedim(d, 0).contiguous()
    gathered = moved.new_empty((size * moved.shape[0], *moved.shape[1:]))
    _barrier(group)
    with timeline.record("comm", "all-gather"):
        dist.all_gather_single(gathered, moved, group=group)
    with timeline.record("compute", "gathered @ W"):
        y = gathered.movedim(0, d) @ weight
    return y, timeline


def overlapped_gather_matmul(
    x_shard: torch.Tensor, weight: torch.Tensor, group=None, *, dim: int = 0
) -> tuple[torch.Tensor, Timeline]:
    """The same ``y`` as :func:`serial_gather_matmul`, with the gather pipelined round a
    ring: at step j, chunk ``(rank - j) mod t`` is multiplied while the next one travels
    (``isend`` to rank+1, ``irecv`` from rank-1). t matmuls, t-1 transfers."""
    d = _check(x_shard, weight, dim)
    rank, size, next_rank, prev_rank = _ring(group)
    timeline = Timeline(rank)
    blocks: list[torch.Tensor | None] = [None] * size
    chunk = x_shard.contiguous()
    _barrier(group)
    for step in range(size):
        source = (rank - step) % size
        incoming, requests = None, []
        posted = now()
        if step < size - 1:
            incoming = torch.empty_like(chunk)
            requests = [
                dist.isend(chunk, next_rank, group=group),
                dist.irecv(incoming, prev_rank, group=group),
            ]
        with timeline.record("compute", f"chunk {source} @ W"):
            blocks[source] = chunk @ weight
        if requests:
            for request in requests:
                request.wait()
            timeline.add("comm", posted, now(), f"chunk {(source - 1) % size} in")
            chunk = incoming
    return torch.cat(blocks, dim=d), timeline


# ------------------------------------------------- row matmul, then reduce-scatter


def serial_matmul_reduce_scatter(
    x: torch.Tensor, weight: torch.Tensor, group=None, *, dim: int = 0
) -> tuple[torch.Tensor, Timeline]:
    """``ReduceScatter(x @ weight along dim)``: multiply, then sum over the ranks and keep
    this rank's 1/t of the sequence. ``x`` holds every token and this rank's slice of the
    features, ``weight`` its row shard ``(in_features / t, out_features)``."""
    d = _check(x, weight, dim)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    _divisible(x, d, size)
    timeline = Timeline(rank)
    _barrier(group)
    with timeline.record("compute", "x @ W"):
        partial = (x @ weight).movedim(d, 0).contiguous()
    out = partial.new_empty((partial.shape[0] // size, *partial.shape[1:]))
    with timeline.record("comm", "reduce-scatter"):
        dist.reduce_scatter_single(out, partial, group=group)
    return out.movedim(0, d), timeline


def overlapped_matmul_reduce_scatter(
    x: torch.Tensor, weight: torch.Tensor, group=None, *, dim: int = 0
) -> tuple[torch.Tensor, Timeline]:
    """The same result as :func:`serial_matmul_reduce_scatter`, pipelined round a ring:
    at step j rank r computes its part of chunk ``(r + j + 1) mod t`` while that chunk's
    running sum comes from rank r+1, adds the two and sends the sum to rank r-1. After t
    steps rank r holds chunk r, summed over every rank (in ring order, so fp32 results
    can differ from the serial ones in the last bits)."""
    d = _check(x, weight, dim)
    rank, size, next_rank, prev_rank = _ring(group)
    _divisible(x, d, size)
    timeline = Timeline(rank)
    chunks = x.chunk(size, dim=d)
    sends = []
    running = None
    _barrier(group)
    for step in range(size):
        target = (rank + step + 1) % size
        request, posted = None, now()
        if running is not None:  # the sum of this step's chunk so far, from rank + 1
            incoming = torch.empty_like(running)
            request = dist.irecv(incoming, next_rank, group=group)
        with timeline.record("compute", f"chunk {target} @ W"):
            mine = chunks[target] @ weight
        if request is not None:
            request.wait()
            timeline.add("comm", posted, now(), f"partial sum {target} in")
            with timeline.record("compute", f"add to sum {target}"):
                mine += incoming
        running = mine
        if step < size - 1:
            sends.append((now(), dist.isend(running, prev_rank, group=group), target))
    for posted, request, target in sends:
        request.wait()
        timeline.add("comm", posted, now(), f"partial sum {target} out")
    return running, timeline


def _divisible(x: torch.Tensor, d: int, size: int) -> None:
    if x.shape[d] % size:
        raise ValueError(
            f"dimension {d} of x has {x.shape[d]} entries, not divisible by the group size "
            f"{size}; pad the sequence to a multiple of {size}"
        )
