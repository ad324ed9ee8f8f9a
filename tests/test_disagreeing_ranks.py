"""Ranks that do not call the same thing: refused at once where a rank can tell, and named
in the timeout's message where only the stacks can (issue 40).
"""

from __future__ import annotations

import pytest

import distlab
from distlab import launch


def _outsider_calls_a_groups_collective(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.collectives import ring_all_reduce

    pair = dist.new_group([0, 1])  # every rank must call new_group, members or not
    if rank == 2:  # not in the pair: torch's all_reduce would return at once here
        ring_all_reduce(torch.ones(4), group=pair)
    return rank


def test_a_collective_on_a_group_the_rank_is_not_in_is_refused_on_that_rank():
    with pytest.raises(distlab.RankError) as info:
        distlab.run(_outsider_calls_a_groups_collective, 3, timeout=60)
    assert info.value.rank == 2 and info.value.exc_type == "ValueError"
    assert "global rank 2 is not a member of the process group it passed" in str(info.value)


def _different_collectives(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.collectives import ring_all_reduce

    if rank == 0:
        ring_all_reduce(torch.ones(4))
    elif rank == 1:
        dist.all_reduce(torch.ones(4))
    return rank  # rank 2 calls nothing and waits in the end-of-job barrier


@pytest.mark.slow
def test_a_timeout_names_the_collective_each_rank_was_in():
    distlab.run(_rank, 3)  # warm workers: the 5 s go to the hang, not to starting them
    with pytest.raises(distlab.LaunchTimeoutError) as info:
        distlab.run(_different_collectives, 3, timeout=5)
    error = info.value
    assert error.collectives == {
        0: "distlab's ring_all_reduce",
        1: "torch.distributed.all_reduce",
        2: "the end-of-job barrier (its function had returned)",
    }
    message = str(error)
    assert "ranks [0, 1] had not finished (ranks [2] had)." in message
    assert "rank 2 had returned from its function and was waiting for the others" in message
    assert (
        "The ranks were not in the same collective (rank 0: distlab's ring_all_reduce; " in message
    )


DUMP = """\
Thread 0x01 (most recent call first):
  File "/x/threading.py", line 9 in wait

Current thread 0x02 (most recent call first):
  File "/site/torch/distributed/distributed_c10d.py", line 5 in recv
  File "/src/distlab/collectives/executor.py", line 88 in execute
  File "/src/distlab/collectives/ring.py", line 40 in ring_all_reduce
  File "/src/distlab/parallel/data/ddp.py", line 70 in sync
  File "<cell>", line 3 in my_fn
  File "/src/distlab/launch/worker.py", line 200 in _run_job
  File "/src/distlab/launch/worker.py", line 80 in _worker_main
"""


def test_the_collective_is_the_outermost_collective_frame_of_the_job_thread():
    assert launch.parent.collective_in(DUMP) == "distlab's ring_all_reduce"
    builtin = DUMP.replace("/src/distlab/collectives/ring.py", "/site/t/c10d_logger.py")
    builtin = builtin.replace("/src/distlab/collectives/executor.py", "/x/distributed_c10d.py")
    builtin = builtin.replace("in execute", "in all_reduce")
    assert launch.parent.collective_in(builtin) == "torch.distributed.all_reduce"
    assert launch.parent.collective_in("") == ""


def _rank(rank, world_size):
    return rank
