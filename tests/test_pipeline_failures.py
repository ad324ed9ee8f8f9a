"""Pipeline failures end every rank with an error naming the rank and the action, never a hang.

Each job runs on two gloo ranks with a 60 s launcher timeout (a hang would
fail the test with ``LaunchTimeoutError`` instead of ``RankError``).
Failures caught before anything runs (a schedule that needs more micro-batches,
a batch that does not split) are checked without launching.
"""

from __future__ import annotations

import pytest
from torch import nn

import distlab
from distlab.core.pipeline_schedule import PipelineSchedule, interleaved
from distlab.models import GPT, GPTConfig, gpt_batch
from distlab.sim.pipeline_replay import ScheduleError, check

CONFIG = GPTConfig(layers=2)
RANK_1 = r"rank 1 \[stage 1 of pp group \(0, 1\)\]: "  # global rank, then its place in the pipeline


class RaiseAt(nn.Module):
    """Runs ``inner``, but raises on the ``n``-th call (a stage with a bug)."""

    def __init__(self, inner: nn.Module, n: int) -> None:
        super().__init__()
        self.inner, self.n, self.calls = inner, n, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.n:
            raise RuntimeError("injected failure")
        return self.inner(x)


def faulty_worker(rank, world_size, fault, text, stage_ranks=None):
    """``stage_ranks``: the global rank of each stage (default: stage r on rank r)."""
    from distlab.parallel.pipeline import build, gpt_stage, run_pipeline

    peers = list(range(world_size)) if stage_ranks is None else list(stage_ranks)
    me = peers.index(rank)  # this rank's stage
    stage = gpt_stage(GPT(CONFIG, seed=0), me, world_size)
    schedule = PipelineSchedule.parse(text) if text else build("1f1b", world_size, 4)
    if fault == "raise" and me == 1:
        stage.chunks[0] = RaiseAt(stage.chunks[0], 3)  # the forward of micro-batch 2
    if fault == "shape" and me == 0:  # the first stage emits 48 features, the next expects 32
        stage.chunks[0] = nn.Sequential(stage.chunks[0], nn.Linear(CONFIG.hidden, 48))
    tokens, targets = gpt_batch(8, CONFIG)
    run_pipeline(schedule, stage, tokens, targets, stage_ranks=stage_ranks)


@pytest.mark.parametrize(
    ("fault", "text", "match"),
    [
        (
            "raise",
            "",
            RANK_1 + r"action 0F2 \(forward of micro-batch 2, chunk 0\) failed: injected",
        ),
        ("shape", "", RANK_1 + r"action 0F0 \(forward of micro-batch 0, chunk 0\) failed"),
        (
            "",
            "rank 0: 0F0 0B0 0F1 0B1\nrank 1: 0F1 0B1 0F0 0B0",
            r"ScheduleError: schedule deadlocks: rank 0 waits at action 0B0",
        ),
    ],
)
def test_failure_names_rank_and_action(fault, text, match):
    with pytest.raises(distlab.RankError, match=match) as caught:
        distlab.run(faulty_worker, 2, args=(fault, text), timeout=60)
    if fault:
        assert caught.value.rank == 1


def test_failure_names_the_global_rank_when_stages_are_not_ranks():
    """Stage 0 on rank 1, stage 1 on rank 0 (as a pp group of a 3D job numbers them): the
    error names global rank 0 and its stage, not the stage number alone as if it were a
    rank (which read "rank 0: raised PipelineError: rank 1: ...")."""
    with pytest.raises(distlab.RankError) as caught:
        distlab.run(faulty_worker, 2, args=("raise", "", (1, 0)), timeout=60)
    assert caught.value.rank == 0
    message = str(caught.value)
    assert "rank 0 [stage 1 of pp group (1, 0)]: action 0F2 (forward of micro-batch 2" in message
    assert "PipelineError: rank 1:" not in message, message


def test_too_few_micro_batches_fail_before_running():
    with pytest.raises(ValueError, match="micro_batches=2, stages=4"):
        interleaved(4, 2, 2)
    with pytest.raises(ScheduleError, match="rank 1 is missing 0F1"):
        check(PipelineSchedule.parse("rank 0: 0F0 0F1 0B0 0B1\nrank 1: 0F0 0B0"))


def test_batch_must_split_into_micro_batches():
    from distlab.parallel.pipeline import build, gpt_stage, run_pipeline

    stage = gpt_stage(GPT(CONFIG, seed=0), 0, 1)
    tokens, targets = gpt_batch(5, CONFIG)
    with pytest.raises(ValueError, match="batch of 5 cannot be cut into m=2"):
        run_pipeline(build("gpipe", 1, 2), stage, tokens, targets)
