"""Two of distlab's collectives at once, on two threads of each rank, stay correct.

FSDP and DDP run their reductions on a communication thread while the main thread
runs tensor parallelism's all-reduces (a TP x PP x DP run with FSDP does exactly
this). The pipelined engine keeps scratch buffers; had the two threads shared one
set, each collective would add the other's chunks (found by the TP2 x PP2 x DP2
FSDP run of tests/test_compose.py, which drifted from one process by 1e-2 to 3e-1).
"""

from __future__ import annotations

import torch

import distlab


def _two_threads(rank, world_size):
    import threading

    import torch.distributed as dist

    from distlab.collectives import ring_all_reduce

    torch.set_num_threads(1)
    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    columns = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    row, column = rows[rank // 2], columns[rank % 2]
    n = 1 << 16  # large enough to be cut into several pipelined segments
    wrong = []

    def reduce_many(group, value, times):
        for _ in range(times):
            x = torch.full((n,), value)
            ring_all_reduce(x, group=group)  # two ranks, each adds its `value`
            if not torch.all(x == 2 * value):
                wrong.append(x.unique().tolist())

    other = threading.Thread(target=reduce_many, args=(column, 1.0, 20))
    other.start()
    reduce_many(row, 2.0, 20)
    other.join()
    return len(wrong)


def test_collectives_on_two_threads_do_not_share_scratch_buffers():
    assert distlab.run(_two_threads, 4, timeout=240) == [0, 0, 0, 0]
