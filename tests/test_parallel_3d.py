"""3D parallelism: the tiny GPT on TP=2 x PP=2 x DP=2 = 8 gloo processes equals one process.

One launch trains ``GPT(CONFIG, seed=0)`` (tied embeddings, so the first and
last stages share the vocabulary-parallel embedding) for a few SGD steps with
1F1B over 2 micro-batches per replica. The losses must equal single-process
training on the whole batch, and every rank's final parameters must equal
its slice (:func:`distlab.parallel.three_d.dense_shard`) of the single-process
model. Tolerance ``rtol=1e-5``: micro-batches, data-parallel halves and
tensor-parallel partial sums add in another order than one dense step.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.models import GPT, GPTConfig, gpt_batch

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
TP, PP, DP, M, STEPS, LR, BATCH = 2, 2, 2, 2, 3, 0.2, 8


def _train(rank, world_size, tp, pp, dp, config):
    torch.set_num_threads(1)
    from distlab.parallel.three_d import train_3d

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    return train_3d(
        config, tokens, targets, tp=tp, pp=pp, dp=dp, micro_batches=M, steps=STEPS, lr=LR
    )


def _single_process():
    model = GPT(CONFIG, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    return model, losses


@pytest.fixture(scope="module")
def runs():
    return distlab.run(_train, TP * PP * DP, args=(TP, PP, DP, CONFIG), timeout=120)


def test_losses_equal_single_process(runs):
    from distlab.parallel.mesh import MeshLayout

    _, want = _single_process()
    assert want[-1] < want[0]  # it really trains
    layout = MeshLayout.for_world(8, tp=TP, pp=PP)
    for run in runs:
        assert run.coordinates == layout.coordinates(run.rank)
        if run.coordinates["pp"] == PP - 1:
            assert run.losses == pytest.approx(want, rel=1e-5), run.rank
        else:
            assert run.losses is None


def test_every_rank_holds_its_slice_of_the_single_process_model(runs):
    from distlab.parallel.three_d import dense_shard

    model, _ = _single_process()
    dense = dict(model.named_parameters())
    dense["tok.weight"] = model.tok.weight
    held = set()
    for run in runs:
        stage = run.coordinates["pp"]
        want_blocks = {f"blocks.{i}." for i in range(stage, stage + 1)}  # L/p = 1 block each
        for name, shard in run.shards.items():
            if name.startswith("blocks."):
                assert name[: len("blocks.0.")] in want_blocks, (run.rank, name)
            want = dense_shard(name, dense[name].detach(), TP, run.coordinates["tp"], CONFIG.vocab)
            torch.testing.assert_close(shard, want, rtol=1e-5, atol=1e-6, msg=f"{run.rank} {name}")
            held.add(name)
    assert held == set(dense) - {"head.weight"}  # tied: the head is tok.weight


@pytest.mark.parametrize(
    "degrees, config, message",
    [
        ((2, 2, 1), CONFIG, "tp\\*pp\\*dp = 2\\*2\\*1 = 4 != world_size=8"),
        ((1, 4, 2), CONFIG, "layers=2 is not divisible by the pipeline-parallel size 4"),
        ((8, 1, 1), CONFIG, "heads=4 is not divisible by the tensor-parallel size 8"),
    ],
)
def test_bad_degrees_name_the_value(degrees, config, message):
    from distlab.parallel.three_d import check_degrees

    with pytest.raises(ValueError, match=message):
        check_degrees(8, config, tp=degrees[0], pp=degrees[1], dp=degrees[2])


def test_bad_degrees_end_the_job_with_the_rank_traceback():
    with pytest.raises(distlab.RankError) as failure:
        distlab.run(_train, 2, args=(2, 2, 1, CONFIG), timeout=60, show_output=False)
    assert "tp*pp*dp = 2*2*1 = 4 != world_size=2" in failure.value.remote_traceback
