"""A rank that fails inside backward ends the whole job: its traceback, no hang, no orphans.

Two places a data-parallel rank can fail during backward: on the
communication thread (an all-reduce raises) and in a gradient hook on the
training thread. Either way the other ranks are left waiting inside a
collective that will never complete; the launcher must report the failing
rank's traceback promptly and kill every worker of the job.
"""

from __future__ import annotations

import time

import psutil
import pytest

import distlab


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


def _fail_in_comm_thread(rank, world_size):
    import torch

    torch.set_num_threads(1)
    from distlab.models import MLP
    from distlab.parallel import BucketedDDP

    ddp = BucketedDDP(MLP(seed=0), bucket_cap_mb=0.004)
    if rank == 1:

        def broken_all_reduce(tensor):
            raise RuntimeError("injected failure on the communication thread")

        ddp.comm.all_reduce_sum_ = broken_all_reduce
    ddp(torch.randn(4, 16)).sum().backward()
    return "finished"


def _fail_in_gradient_hook(rank, world_size):
    import torch

    torch.set_num_threads(1)
    from distlab.models import MLP
    from distlab.parallel import FSDP

    model = MLP(seed=0)
    if rank == 0:

        def broken_hook(param):
            raise ValueError("injected failure in a gradient hook")

        model.layers[0].weight.register_post_accumulate_grad_hook(broken_hook)
    fsdp = FSDP(model, wrap="layer")
    fsdp(torch.randn(4, 16)).sum().backward()
    return "finished"


@pytest.mark.slow
@pytest.mark.parametrize(
    "worker, rank, message",
    [
        (_fail_in_comm_thread, 1, "injected failure on the communication thread"),
        (_fail_in_gradient_hook, 0, "injected failure in a gradient hook"),
    ],
)
def test_a_rank_failing_in_backward_stops_the_job(worker, rank, message):
    before = _children()
    start = time.monotonic()
    with pytest.raises(distlab.RankError) as failure:
        distlab.run(worker, 3, warm=False, timeout=60, show_output=False)
    assert time.monotonic() - start < 30, "the job hung instead of failing promptly"
    assert failure.value.rank == rank
    assert message in failure.value.remote_traceback
    assert "backward" in failure.value.remote_traceback  # raised from inside loss.backward()
    assert _children() <= before, "a worker of the failed job is still alive"
