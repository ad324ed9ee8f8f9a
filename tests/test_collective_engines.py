"""The executor's engines give the built-ins' results, bit for bit, for every registered algorithm.

``run_steps`` (the reference executor), the pipelined engine (gloo's default) and the
step-by-step engine (NCCL's) each play every schedule of the registry, once with the default
segment size and once with 8-byte segments (one float64 element: every message is cut into
many segments, which the default 4 MiB never does on test-sized tensors); the pipelined engine
also once with its eager receives off (``EAGER_BYTES = 0``: every receive that must wait is
posted when it may, into place), since test-sized messages are all small enough to be eager.
Data are integers in float64, so every reduction order gives the same bits and equality is
exact.
"""

from __future__ import annotations

import pytest

import distlab

NUMEL = 37  # not a multiple of any world size: chunks of unequal length
ENGINES = [("reference", None), ("pipelined", None), ("pipelined", 8), ("step_by_step", None),
           ("step_by_step", 8), ("pipelined, not eager", None)]  # fmt: skip


def _engines_worker(rank, n):
    import torch
    import torch.distributed as dist

    from distlab.collectives import pipelined
    from distlab.collectives.buffers import Chunks
    from distlab.collectives.executor import DEFAULT_SEGMENT_BYTES, execute
    from distlab.sim.algorithms import REGISTRY

    base = torch.arange(1, NUMEL + 1, dtype=torch.float64)
    mine = base * (rank + 1)
    mismatches = []
    for name, entry in REGISTRY.items():
        if entry.short == "hierarchical_shard" and n % 2:
            continue
        schedule = entry.schedule(n, ranks_per_node=2)
        expected = _builtin_result(entry.collective, mine, n, rank, schedule.n_chunks)
        for engine, segment in ENGINES:
            eager = pipelined.EAGER_BYTES
            if engine == "pipelined, not eager":
                engine, pipelined.EAGER_BYTES = "pipelined", 0
            try:
                got = _play(
                    execute, Chunks, schedule, mine, engine, segment or DEFAULT_SEGMENT_BYTES
                )
            finally:
                pipelined.EAGER_BYTES = eager
            if not all(torch.equal(a, b) for a, b in zip(got, expected)):
                mismatches.append((name, engine, segment))
    dist.barrier()
    return mismatches


def _play(execute, Chunks, schedule, mine, engine, segment_bytes):
    """This rank's view of the result after ``schedule`` (the parts the built-in defines)."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    if schedule.collective == "all_to_all":
        inputs = list(_equal_blocks(mine, n).clone().tensor_split(n))
        outputs = [torch.zeros_like(t) for t in inputs]
        execute(schedule, Chunks.of_list(inputs), out=Chunks.of_list(outputs),
                engine=engine, segment_bytes=segment_bytes)  # fmt: skip
        return outputs
    x = mine.clone()
    if schedule.collective == "all_gather":  # rank r starts with only its own chunk
        keep = Chunks.split(x, n).pieces[rank].clone()
        x.zero_()
        Chunks.split(x, n).pieces[rank].copy_(keep)
    chunks = Chunks.split(x, schedule.n_chunks)
    execute(schedule, chunks, engine=engine, segment_bytes=segment_bytes)
    if schedule.collective == "reduce_scatter":
        return [chunks.pieces[rank]]
    if schedule.collective == "reduce":
        return [x] if rank == 0 else []
    return [x]


def _builtin_result(collective, mine, n, rank, n_chunks):
    """What torch.distributed's own collective gives for the same input (root 0)."""
    import torch
    import torch.distributed as dist

    from distlab.core.collective_schedule import chunk_bounds

    x = mine.clone()
    if collective == "all_to_all":
        inputs = list(_equal_blocks(x, n).tensor_split(n))
        outputs = [torch.zeros_like(t) for t in inputs]
        dist.all_to_all(outputs, inputs)
        return outputs
    if collective in ("all_reduce", "reduce_scatter", "reduce"):
        dist.all_reduce(x)
        if collective == "reduce_scatter":
            a, b = chunk_bounds(x.numel(), n)[rank]
            return [x[a:b]]
        return [x] if collective == "all_reduce" or rank == 0 else []
    if collective == "broadcast":
        dist.broadcast(x, 0)
        return [x]
    pieces = [torch.zeros_like(x) for _ in range(n)]  # all_gather: chunk r from rank r
    dist.all_gather(pieces, x)
    bounds = chunk_bounds(x.numel(), n)
    return [torch.cat([pieces[r][a:b] for r, (a, b) in enumerate(bounds)])]


def _equal_blocks(x, n):
    """gloo's all_to_all needs equal blocks: the first multiple of n elements."""
    return x[: x.numel() // n * n]


@pytest.mark.parametrize("world_size", [3, 4])
def test_every_engine_matches_the_builtins(world_size):
    assert distlab.run(_engines_worker, world_size, timeout=120) == [[]] * world_size
