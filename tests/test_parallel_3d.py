"""3D parallelism: the tiny GPT on TP=2 x PP=2 x DP=2 = 8 gloo processes equals one process.

One launch per configuration trains ``GPT(CONFIG, seed=0)`` (tied embeddings,
so the first and last stages share the vocabulary-parallel embedding) for 20
steps of SGD with momentum over 2 micro-batches per replica:

* ``dp``: 1F1B, gradients all-reduced over dp;
* ``zero1``: 1F1B, ZeRO-1 over dp (reduce-scatter, 1/dp of the update,
  all-gather);
* ``interleaved``: the interleaved schedule with v = 2 chunks per rank (each
  of the 4 blocks is a virtual stage: stage 0 holds blocks 0 and 2, stage 1
  blocks 1 and 3 and the head), ZeRO-1.

The losses must equal single-process training on the whole batch with the
same optimizer, and every rank's final parameters must equal its slice
(:func:`distlab.parallel.compose.three_d.dense_shard`) of the single-process model.
Tolerance ``rtol=1e-5``: micro-batches, data-parallel halves and
tensor-parallel partial sums add in another order than one dense step.
(Adam is not used here: it divides by sqrt(v), so an element whose gradient
nearly cancels turns that fp32 reordering into a visible difference; over 20
steps at lr 0.01 its parameters drifted by more than 1e-3 even between one process
with and without gradient accumulation.) The optimizer state each rank
measured must be what :func:`distlab.calc.memory.model_state_bytes` says for
its shard.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

import distlab
from distlab.calc.memory import get_recipe, model_state_bytes
from distlab.models import GPT, GPTConfig, gpt_batch

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
TP, PP, DP, M, STEPS, BATCH = 2, 2, 2, 2, 20, 8
OPTIMIZER, LR = "sgd_momentum", 0.1
CASES = {
    "dp": {"zero_stage": 0},
    "zero1": {"zero_stage": 1},
    "interleaved": {"zero_stage": 1, "schedule": "interleaved", "chunks": 2},
}
LAUNCH_SECONDS: dict[str, float] = {}  # wall time of each 8-process launch


def _train(rank, world_size, tp, pp, dp, config, options):
    torch.set_num_threads(1)
    from distlab.parallel.compose.three_d import train_3d

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    return train_3d(
        config, tokens, targets, tp=tp, pp=pp, dp=dp, micro_batches=M, steps=STEPS,
        optimizer=OPTIMIZER, lr=LR, **options,
    )  # fmt: skip


def _single_process():
    from distlab.parallel.compose import OPTIMIZERS

    torch_class, kwargs, _ = OPTIMIZERS[OPTIMIZER]
    model = GPT(CONFIG, seed=0)
    step_with = torch_class(model.parameters(), lr=LR, **kwargs)
    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    losses = []
    for _ in range(STEPS):
        step_with.zero_grad(set_to_none=True)
        loss = model.loss(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        step_with.step()
    return model, losses


@pytest.fixture(scope="module")
def single_process():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a loaded 2-core machine are much slower
    try:
        return _single_process()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, single_process):
    options = CASES[request.param]
    start = time.perf_counter()
    runs = distlab.run(_train, TP * PP * DP, args=(TP, PP, DP, CONFIG, options), timeout=240)
    LAUNCH_SECONDS[request.param] = time.perf_counter() - start
    print(f"\n{request.param}: 8-process launch of {STEPS} steps took "
          f"{LAUNCH_SECONDS[request.param]:.1f} s")  # fmt: skip
    return options, runs, *single_process


@pytest.mark.slow
def test_losses_equal_single_process(case):
    from distlab.core.layout import Layout

    _, runs, _, want = case
    assert want[-1] < 0.8 * want[0]  # it really trains
    layout = Layout.for_world(8, tp=TP, pp=PP)
    for run in runs:
        assert run.coordinates == layout.coordinates(run.rank)
        if run.coordinates["pp"] == PP - 1:
            assert len(run.losses) == STEPS
            assert run.losses == pytest.approx(want, rel=1e-5), run.rank
            worst = max(abs(a - b) / abs(b) for a, b in zip(run.losses, want))
            print(f"rank {run.rank}: max relative loss difference {worst:.2e}")
        else:
            assert run.losses is None


@pytest.mark.slow
def test_every_rank_reports_its_step_times_and_activation_peak(case):
    """What benchmarks/three_d.py reads: one wall time per step, and the executor's peak
    of activation bytes kept for backward (every stage keeps some)."""
    _, runs, _, _ = case
    for run in runs:
        assert len(run.step_seconds) == STEPS and all(s > 0 for s in run.step_seconds)
        assert run.peak_activation_bytes > 0, run.rank


def _blocks_of(stage: int, chunks: int) -> set[int]:
    """Block indices the rank at pipeline stage ``stage`` holds: virtual stages
    j = c p + stage, L/(p v) blocks each (Narayanan et al. 2021, Section 2.2.2)."""
    per = CONFIG.layers // (PP * chunks)
    return {(c * PP + stage) * per + i for c in range(chunks) for i in range(per)}


@pytest.mark.slow
def test_every_rank_holds_its_slice_of_the_single_process_model(case):
    from distlab.parallel.compose import dense_shard

    options, runs, model, _ = case
    dense = dict(model.named_parameters())
    dense["tok.weight"] = model.tok.weight
    held = set()
    for run in runs:
        stage = run.coordinates["pp"]
        blocks = {int(n.split(".")[1]) for n in run.shards if n.startswith("blocks.")}
        assert blocks == _blocks_of(stage, options.get("chunks", 1)), run.rank
        for name, shard in run.shards.items():
            want = dense_shard(name, dense[name].detach(), TP, run.coordinates["tp"], CONFIG.vocab)
            torch.testing.assert_close(shard, want, rtol=1e-5, atol=1e-6, msg=f"{run.rank} {name}")
            held.add(name)
    assert held == set(dense) - {"head.weight"}  # tied: the head is tok.weight


@pytest.mark.slow
def test_optimizer_state_bytes_match_the_memory_formula(case):
    """Measured optimizer-state bytes = K Ψ_rank (plain) or K ceil(Ψ_rank / dp) (ZeRO-1,
    one flat bucket padded to a multiple of dp), K = the recipe's optimizer bytes."""
    from distlab.parallel.compose import OPTIMIZERS

    options, runs, _, _ = case
    recipe = OPTIMIZERS[OPTIMIZER][2]
    k = get_recipe(recipe).optimizer_bytes
    zero = options["zero_stage"]
    for run in runs:
        formula = model_state_bytes(run.parameters, recipe=recipe, zero_stage=zero, dp=DP)
        held = math.ceil(run.parameters / DP) if zero else run.parameters
        assert run.optimizer_state_bytes == k * held, run.rank
        assert run.optimizer_state_bytes == pytest.approx(formula.optimizer_states, abs=k), run.rank
        print(
            f"{OPTIMIZER} zero_stage={zero} rank {run.rank}: Ψ_rank={run.parameters}, "
            f"optimizer state {run.optimizer_state_bytes} B measured, "
            f"{formula.optimizer_states:.0f} B by distlab.calc.memory"
        )


@pytest.mark.parametrize(
    "degrees, config, message",
    [
        ((2, 0, 4, 1), CONFIG, "pp must be an integer >= 1, got 0"),
        (
            (1, 8, 1, 1),
            CONFIG,
            "layers=4 is not divisible by the number of virtual stages pp\\*v = 8\\*1",
        ),
        ((8, 1, 1, 1), CONFIG, "heads=4 is not divisible by the tensor-parallel size 8"),
        (  # GPTConfig needs heads | hidden, so tp | heads makes tp | hidden too
            (2, 2, 2, 1),
            GPTConfig(vocab=62, seq_len=8, hidden=30, heads=3, layers=4),
            "heads=3 is not divisible by the tensor-parallel size 2",
        ),
        (
            (2, 2, 2, 3),
            CONFIG,
            "layers=4 is not divisible by the number of virtual stages pp\\*v = 2\\*3 = 6",
        ),
        ((2, 2, 2, 0), CONFIG, "virtual_stages must be an integer >= 1, got 0"),
    ],
)
def test_bad_degrees_name_the_value(degrees, config, message):
    """The layout checks its own values once; check_model what the model must divide."""
    from distlab.core.layout import Layout
    from distlab.parallel.compose import check_model

    tp, pp, dp, chunks = degrees
    with pytest.raises(ValueError, match=message):
        check_model(GPT(config), Layout(tp=tp, pp=pp, dp=dp, virtual_stages=chunks))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"optimizer": "lamb"}, "unknown optimizer 'lamb'; allowed: sgd, sgd_momentum, adam"),
        ({"zero_stage": 4}, "zero_stage must be an integer in 0..3, got 4"),
        ({"zero_stage": True}, "got True"),
        ({"schedule": "1f2b"}, "unknown schedule '1f2b'; allowed: gpipe, 1f1b"),
        (
            {"chunks": 2},
            "virtual_stages=2 needs a schedule with model chunks looping .*, not '1f1b'",
        ),
        ({"schedule": "interleaved", "micro_batches": 3}, "micro_batches=3, stages=2"),
        ({"schedule": "interleaved", "chunks": 2, "pp": 1}, "virtual_stages=2 needs pp >= 2"),
    ],
)
def test_bad_options_name_the_value(options, message):
    """train_3d's options end before any process group is needed, naming the value."""
    from distlab.parallel.compose.three_d import train_3d

    kwargs = {"optimizer": "sgd", "zero_stage": 0, "schedule": "1f1b", "pp": 2, "micro_batches": 2}
    kwargs = {**kwargs, **options}
    chunks = kwargs.pop("chunks", 1)
    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    with pytest.raises((ValueError, TypeError), match=message):  # TypeError: zero_stage=True
        train_3d(CONFIG, tokens, targets, tp=1, dp=1, steps=1, lr=LR, chunks=chunks, **kwargs)


def test_bad_degrees_end_the_job_with_the_rank_traceback():
    options = {}
    with pytest.raises(distlab.RankError) as failure:
        distlab.run(_train, 2, args=(2, 2, 1, CONFIG, options), timeout=60, show_output=False)
    assert "needs 4 ranks, but the job has 2" in failure.value.remote_traceback


def test_plain_sgd_equals_torch_sgd_bit_for_bit():
    """PlainSGD (train_3d's "sgd" without ZeRO) takes exactly torch.optim.SGD's steps."""
    from distlab.parallel.compose import PlainSGD

    def train(make):
        model = GPT(CONFIG, seed=0)
        optimizer = make(model.parameters())
        for step in range(3):
            optimizer.zero_grad(set_to_none=True)
            model.loss(*gpt_batch(4, CONFIG, seed=step)).backward()
            optimizer.step()
        return model.state_dict()

    ours = train(lambda params: PlainSGD(params, lr=LR))
    torch_sgd = train(lambda params: torch.optim.SGD(params, lr=LR))
    assert all(torch.equal(ours[k], torch_sgd[k]) for k in ours)
    assert not torch.equal(ours["tok.weight"], GPT(CONFIG, seed=0).state_dict()["tok.weight"])
