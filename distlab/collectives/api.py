"""The shared front end of every collective: check inputs, then play a schedule.

Each algorithm module (ring, tree, ...) defines *what moves where* as a
:class:`~distlab.core.collective_schedule.CollectiveSchedule`; these functions do the same
bookkeeping for all of them, mirroring ``torch.distributed``'s signatures:

* every rank agrees the inputs match (:mod:`distlab.collectives.agree`), so a
  mistake raises the same ``ValueError`` on every rank instead of hanging;
* the tensor is viewed as chunks, the schedule is executed, and ``AVG`` is a
  ``SUM`` divided by the world size at the end.

A schedule depends only on the number of ranks (and a root, or the ranks per node), so each
is built once per process (:func:`cached_schedule`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from distlab.core.collective_schedule import CollectiveSchedule

from .agree import (
    Problem,
    check_agreement,
    describe,
    dtype_code,
    explain_chunks,
    explain_tensor,
    local_problem,
)
from .buffers import Chunks, Group, finish_average_, group_info, op_name
from .executor import DEFAULT_SEGMENT_BYTES, execute

ScheduleFor = Callable[..., CollectiveSchedule]


def cached_schedule(schedule_for: ScheduleFor, *args) -> CollectiveSchedule:
    """``schedule_for(*args)``, built once per process and then reused: a schedule is
    frozen, and building one checks every step (a ring all-reduce on 8 ranks takes about
    0.6 ms to build, longer than a small all-reduce takes on the wire). Arguments that
    cannot be a cache key (a list given as ``ranks_per_node``) go to ``schedule_for``
    itself, whose check names them."""
    try:
        hash(args)
    except TypeError:
        return schedule_for(*args)
    return _built_once(schedule_for, *args)


@functools.lru_cache(maxsize=256)
def _built_once(schedule_for: ScheduleFor, *args) -> CollectiveSchedule:
    return schedule_for(*args)


def _bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def _per_rank_sizes(
    blocks: torch.Tensor | Sequence[torch.Tensor], own: torch.Tensor, rank: int, n: int
) -> tuple[list[int], int]:
    """Element count of each rank's block, and a problem code (0 when fine).

    ``blocks`` is one tensor per rank, or one tensor of ``n`` blocks the size
    of ``own``; this rank's block must have ``own``'s size.
    Problems: ``LIST_LENGTH`` (not one tensor per rank), ``OUTPUT_SIZE`` (sizes that do not fit).
    """
    if isinstance(blocks, (list, tuple)):
        if len(blocks) != n:
            return [0] * n, Problem.LIST_LENGTH
        sizes = [t.numel() for t in blocks]
    else:
        sizes = [own.numel()] * n
        if blocks.numel() != n * own.numel():
            return sizes, Problem.OUTPUT_SIZE
    return sizes, (Problem.OUTPUT_SIZE if sizes[rank] != own.numel() else Problem.NONE)


def all_reduce(
    schedule_for: ScheduleFor,
    name: str,
    tensor: torch.Tensor,
    op,
    group: Group,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    *,
    schedule_args: tuple = (),
) -> None:
    """In place: every rank ends with ``op`` over all ranks' ``tensor``; the schedule is
    that of ``schedule_for`` for ``n`` ranks and ``schedule_args``."""
    _, n = group_info(group)
    problem, op_code = local_problem([tensor], op)
    check_agreement(name, group, tensor.device, problem, op_code, describe(tensor))
    op = op_name(op)
    if n > 1 and tensor.numel():
        the_schedule = cached_schedule(schedule_for, n, *schedule_args)
        execute(
            the_schedule,
            Chunks.split(tensor, the_schedule.n_chunks),
            op=op,
            group=group,
            segment_bytes=segment_bytes,
        )
    finish_average_(tensor, op, n)


def reduce_scatter(
    schedule_for: ScheduleFor,
    name: str,
    output: torch.Tensor,
    input: torch.Tensor | Sequence[torch.Tensor],
    op,
    group: Group,
) -> None:
    """Rank ``r``'s ``output`` gets ``op`` over all ranks of block ``r`` of ``input``.

    ``input`` is a tensor of ``world_size * output.numel()`` elements (like
    ``reduce_scatter_tensor``) or a list of one tensor per rank, sizes free
    (like ``reduce_scatter``). The input is not modified.
    """
    rank, n = group_info(group)
    tensors = list(input) if isinstance(input, (list, tuple)) else [input]
    problem, op_code = local_problem([output, *tensors], op)
    sizes, shape_problem = _per_rank_sizes(input, output, rank, n)
    problem = problem or shape_problem
    check_agreement(
        name,
        group,
        output.device,
        problem,
        op_code,
        [dtype_code(output), *sizes],
        explain=explain_chunks,
    )
    op = op_name(op)
    work = torch.cat([t.reshape(-1) for t in tensors]) if tensors else output.new_empty(0)
    bounds = _bounds(sizes)
    if n > 1 and work.numel():
        execute(cached_schedule(schedule_for, n), Chunks.of_flat(work, bounds), op=op, group=group)
    start, stop = bounds[rank]
    output.view(-1).copy_(work[start:stop])
    finish_average_(output, op, n)


def all_gather(
    schedule_for: ScheduleFor,
    name: str,
    output: torch.Tensor | list[torch.Tensor],
    input: torch.Tensor,
    group: Group,
) -> None:
    """Every rank's ``output`` gets all ranks' ``input``, in rank order.

    ``output`` is a tensor of ``world_size * input.numel()`` elements (like
    ``all_gather_into_tensor``) or a list of one tensor per rank (like
    ``all_gather``), where entry ``r`` has rank ``r``'s size.
    """
    rank, n = group_info(group)
    as_list = isinstance(output, (list, tuple))
    tensors = list(output) if as_list else [output]
    problem, op_code = local_problem([input, *tensors], None, reduces=False)
    sizes, shape_problem = _per_rank_sizes(output, input, rank, n)
    problem = problem or shape_problem
    check_agreement(
        name,
        group,
        input.device,
        problem,
        op_code,
        [dtype_code(input), *sizes],
        explain=explain_chunks,
    )
    bounds = _bounds(sizes)
    work = output.view(-1) if not as_list else input.new_empty(sum(sizes))
    start, stop = bounds[rank]
    work[start:stop].copy_(input.reshape(-1))
    if n > 1 and work.numel():
        execute(cached_schedule(schedule_for, n), Chunks.of_flat(work, bounds), group=group)
    if as_list:
        for t, (a, b) in zip(output, bounds):
            t.view(-1).copy_(work[a:b])


def rooted(
    schedule_for: Callable[[int, int], CollectiveSchedule],
    name: str,
    tensor: torch.Tensor,
    root: int,
    op,
    group: Group,
    *,
    reduces: bool,
) -> None:
    """Reduce to ``root`` (``reduces=True``) or broadcast from ``root``, in place."""
    rank, n = group_info(group)
    problem, op_code = local_problem([tensor], op, reduces=reduces)
    if not isinstance(root, int) or not 0 <= root < n:
        problem, root = problem or Problem.ROOT, -1
    check_agreement(
        name,
        group,
        tensor.device,
        problem,
        op_code,
        [root, *describe(tensor)],
        explain=lambda h: f"root {h[0]}, {explain_tensor(h[1:])}",
    )
    op = op_name(op) if reduces else "sum"
    if n > 1 and tensor.numel():
        the_schedule = cached_schedule(schedule_for, n, root)
        execute(the_schedule, Chunks.split(tensor, the_schedule.n_chunks), op=op, group=group)
    if reduces and rank == root:
        finish_average_(tensor, op, n)


def all_to_all(
    schedule_for: ScheduleFor,
    name: str,
    outputs: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    group: Group,
) -> None:
    """``outputs[j]`` on rank ``r`` receives ``inputs[r]`` of rank ``j``."""
    _, n = group_info(group)
    outputs, inputs = list(outputs), list(inputs)
    problem, op_code = local_problem([*inputs, *outputs], None, reduces=False)
    if len(inputs) != n or len(outputs) != n:
        problem = problem or 5
        inputs_sizes = outputs_sizes = [0] * n
    else:
        inputs_sizes = [t.numel() for t in inputs]
        outputs_sizes = [t.numel() for t in outputs]
    dtype = dtype_code(inputs[0]) if inputs else -1
    headers = check_agreement(
        name,
        group,
        (inputs or outputs)[0].device,
        problem,
        op_code,
        [dtype, *inputs_sizes, *outputs_sizes],
        same_on_all_ranks=False,
    )
    for r, row in enumerate(headers):
        if row[2] != headers[0][2]:
            raise ValueError(f"{name}: ranks disagree on the dtype (rank 0 vs rank {r})")
        for j in range(n):
            sends, expects = row[3 + j], headers[j][3 + n + r]
            if sends != expects:
                raise ValueError(
                    f"{name}: rank {r} sends {sends} elements to rank {j}, "
                    f"but rank {j} expects {expects} from rank {r}"
                )
    execute(
        cached_schedule(schedule_for, n),
        Chunks.of_list(inputs),
        out=Chunks.of_list(outputs),
        group=group,
    )
