"""An algorithm is a schedule.

Every collective algorithm in distlab is written down once, as data: the
buffer is cut into ``n_chunks`` pieces, and the algorithm is a list of
*steps*. In one step, some ranks send some chunks to other ranks, all at the
same time; the receiver either *reduces* what arrives into its own copy
(``dst = op(dst, received)``) or *copies* it over its own copy.

The same :class:`CollectiveSchedule` object is

1. executed on real processes by :func:`distlab.collectives.executor.execute`
   (``torch.distributed`` point-to-point ops only),
2. replayed on a modelled cluster by :mod:`distlab.sim` (time, bytes per link),
3. drawn by :mod:`distlab.viz`.

This module is pure Python (no torch), so the simulator can import it.

Example: ring all-reduce on 3 ranks is 2 * (3 - 1) = 4 steps::

    >>> from distlab.collectives.ring import ring_all_reduce_schedule
    >>> s = ring_all_reduce_schedule(3)
    >>> len(s.steps), s.n_chunks
    (4, 3)
    >>> s.steps[0][0]
    Transfer(src=0, dst=1, chunks=(2,), reduce=True, dst_chunks=None)
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .checks import positive_int
from .renamed import old_names

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


@dataclass(frozen=True)
class Transfer:
    """One message: ``src`` sends its chunks ``chunks`` to ``dst``.

    ``reduce=True``: the receiver combines the data with its own chunks using
    the collective's op. ``reduce=False``: the receiver overwrites them.
    ``dst_chunks`` says where the data lands when that differs from where it
    came from (all-to-all); ``None`` means "the same chunk indices".
    ``src == dst`` is a local copy (all-to-all keeps its own block).
    """

    src: int
    dst: int
    chunks: tuple[int, ...]
    reduce: bool
    dst_chunks: tuple[int, ...] | None = None

    @property
    def landing(self) -> tuple[int, ...]:
        """Chunk indices written on the receiver."""
        return self.chunks if self.dst_chunks is None else self.dst_chunks


Step = tuple[Transfer, ...]


@dataclass(frozen=True)
class CollectiveSchedule:
    """A collective algorithm as data: which chunks move where, step by step.

    ``root`` is set for rooted collectives (reduce, broadcast).
    ``out_of_place`` is True when senders read an input buffer and receivers
    write a separate output buffer (all-to-all); otherwise both read and
    write one buffer in place.
    """

    collective: str
    algorithm: str
    world_size: int
    n_chunks: int
    steps: tuple[Step, ...]
    root: int | None = None
    out_of_place: bool = False
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        validate(self)

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def transfers(self) -> Iterable[tuple[int, Transfer]]:
        """(step index, transfer) for every message in order."""
        for i, step in enumerate(self.steps):
            for t in step:
                yield i, t

    def chunks_sent(self, rank: int) -> int:
        """How many chunks ``rank`` sends over the whole schedule (local copies excluded)."""
        return sum(len(t.chunks) for _, t in self.transfers() if t.src == rank and t.dst != rank)

    def bytes_sent(self, rank: int, chunk_bytes: Sequence[int]) -> int:
        """Bytes ``rank`` sends, given the size in bytes of each chunk."""
        return sum(
            sum(chunk_bytes[c] for c in t.chunks)
            for _, t in self.transfers()
            if t.src == rank and t.dst != rank
        )


def check_ranks(n: int) -> int:
    """``n`` as a number of ranks: an int >= 1, else the error :func:`positive_int` gives."""
    return positive_int("number of ranks n", n)


def log2_ceil(n: int) -> int:
    """``ceil(log2 n)``: rounds of a binomial tree or of recursive doubling on ``n`` ranks
    (0 for ``n == 1``)."""
    check_ranks(n)
    return (n - 1).bit_length()


def chunk_bounds(numel: int, n_chunks: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``n_chunks`` near-equal contiguous pieces.

    The first ``numel % n_chunks`` pieces get one element more, so every rank
    computes the same bounds. Pieces may be empty when ``numel < n_chunks``.

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    if n_chunks < 1:
        raise ValueError(f"n_chunks must be >= 1, got {n_chunks}")
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    base, extra = divmod(numel, n_chunks)
    bounds, start = [], 0
    for i in range(n_chunks):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def validate(schedule: CollectiveSchedule) -> None:
    """Reject schedules that could not run: bad ranks or chunks, or a step that
    both sends a chunk and overwrites it on the same rank (a race)."""
    n = schedule.world_size
    if schedule.collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {schedule.collective!r}; allowed: {COLLECTIVES}")
    if n < 1:
        raise ValueError(f"world_size must be >= 1, got {n}")
    for i, step in enumerate(schedule.steps):
        written: set[tuple[int, int]] = set()
        read: set[tuple[int, int]] = set()
        for t in step:
            if not (0 <= t.src < n and 0 <= t.dst < n):
                raise ValueError(f"step {i}: {t} names a rank outside 0..{n - 1}")
            if len(t.chunks) != len(t.landing) or not t.chunks:
                raise ValueError(f"step {i}: {t} must move the same, non-zero number of chunks")
            for c in (*t.chunks, *t.landing):
                if not 0 <= c < schedule.n_chunks:
                    raise ValueError(
                        f"step {i}: {t} names chunk {c} outside 0..{schedule.n_chunks - 1}"
                    )
            if not _is_run(t.chunks) or not _is_run(t.landing):
                raise ValueError(f"step {i}: {t} must move a contiguous run of chunks")
            read.update((t.src, c) for c in t.chunks)
            written.update((t.dst, c) for c in t.landing)
        if not schedule.out_of_place and read & written:
            raise ValueError(
                f"step {i} reads and writes the same chunk on one rank: {sorted(read & written)}"
            )


def _is_run(chunks: tuple[int, ...]) -> bool:
    return all(b == a + 1 for a, b in itertools.pairwise(chunks))


def merge_parallel(*step_lists: Sequence[Step]) -> tuple[Step, ...]:
    """Run several independent sub-schedules side by side: step i of the
    result holds step i of each (used by hierarchical and double-tree)."""
    length = max((len(s) for s in step_lists), default=0)
    merged = []
    for i in range(length):
        merged.append(tuple(t for steps in step_lists if i < len(steps) for t in steps[i]))
    return tuple(merged)


def trace(schedule: CollectiveSchedule) -> list[list[list[Counter]]]:
    """Play a schedule symbolically: which ranks' data each chunk holds after each step.

    Returns ``states``: ``states[s][r][c]`` is a Counter of contributions in
    chunk ``c`` of rank ``r`` after ``s`` steps (``states[0]`` is the start).
    A contribution is the rank it came from (for all-to-all: ``(rank, block)``).
    A Counter, not a set, so an algorithm that adds a value twice is caught.
    Used by the tests (every algorithm ends in the right state) and by the
    step-by-step players in :mod:`distlab.viz`.
    """
    n, k = schedule.world_size, schedule.n_chunks
    state = [[_start(schedule, r, c) for c in range(k)] for r in range(n)]
    out = [[Counter() for _ in range(k)] for _ in range(n)] if schedule.out_of_place else state
    states = [_snapshot(out)]
    for step in schedule.steps:
        sent = [(t, [Counter(state[t.src][c]) for c in t.chunks]) for t in step]
        for t, payload in sent:
            for c, data in zip(t.landing, payload):
                if t.reduce:
                    out[t.dst][c] += data
                else:
                    out[t.dst][c] = data
        states.append(_snapshot(out))
    return states


def _start(schedule: CollectiveSchedule, rank: int, chunk: int) -> Counter:
    if schedule.collective == "all_to_all":
        return Counter([(rank, chunk)])
    if schedule.collective == "all_gather":
        return Counter([rank]) if chunk == rank else Counter()
    if schedule.collective == "broadcast":
        return Counter([rank]) if rank == schedule.root else Counter()
    return Counter([rank])


def _snapshot(state: list[list[Counter]]) -> list[list[Counter]]:
    return [[Counter(c) for c in row] for row in state]


# the old name, which notebooks from older releases still import from here
__getattr__ = old_names(__name__, {"Schedule": CollectiveSchedule})
