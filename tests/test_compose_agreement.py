"""Ranks that disagree on what to run: :func:`distlab.parallel.compose.train` refuses at once.

Before this check, one rank with another batch trained silently wrong, one with another
learning rate was accepted, and one with another layout or step count hung until the
launcher's timeout. Now every rank raises the same ``ValueError`` naming what differs,
before any process group is built (:func:`distlab.parallel.comm.agreement.check_same_across_ranks`).

One 2-process job runs every case in turn (an agreement error leaves the ranks in step,
so the next ``train`` call can start): in each case rank 1 changes one argument and both
ranks must return the same message, within seconds. Without the check, the lr and token
cases train to other losses without a word and the steps case hangs. Two more jobs: ranks
that agree train as one process on the whole batch, and an uncaught disagreement ends the
job with ``distlab.run``'s ``RankError`` for the ``ValueError``, not a
``LaunchTimeoutError``. How the error reads on more ranks is checked without processes
(:func:`~distlab.parallel.comm.agreement.first_difference`).
"""

from __future__ import annotations

import math
import time

import pytest
import torch

import distlab
from distlab.core.layout import Layout
from distlab.models import GPT, GPTConfig, gpt_batch
from distlab.parallel.comm.agreement import check_same_across_ranks, describe, first_difference

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
BATCH, STEPS, LR = 8, 2, 0.1
BASE = {
    "layout": Layout(dp=2),
    "batch": BATCH,
    "changed": None,  # ("tokens" or "targets", row): one token of that row changed
    "config": CONFIG,
    "seed": 0,
    "steps": STEPS,
    "lr": LR,
    "optimizer": "sgd",
    "save_to": None,
    "save_after": None,
    "resume_from": None,
}

# case: (what rank 1 changes, what every rank's error must start with)
CASES = {
    "token": (
        {"changed": ("tokens", 4)},  # rows 4..7 are rank 1's share
        "the batch (tokens) differs across ranks: rank 1's differs from rank 0's (int64 (8, 8))",
    ),
    "target": (
        {"changed": ("targets", 7)},
        "the batch (targets) differs across ranks: rank 1's differs from rank 0's (int64 (8, 8))",
    ),
    "batch size": (
        {"batch": 4},
        "the batch (tokens) differs across ranks: rank 0: int64 (8, 8), rank 1: int64 (4, 8)",
    ),
    "lr": ({"lr": 0.2}, "lr differs across ranks: rank 0: 0.1, rank 1: 0.2"),
    "lr by one ulp": (
        {"lr": math.nextafter(LR, 1.0)},
        "lr differs across ranks: rank 0: 0.1, rank 1: 0.10000000000000002",
    ),
    "optimizer": (
        {"optimizer": "adam"},
        "optimizer differs across ranks: rank 0: 'sgd', rank 1: 'adam'",
    ),
    "micro_batches": (
        {"layout": Layout(dp=2, micro_batches=2)},
        "layout.micro_batches differs across ranks: rank 0: 1, rank 1: 2",
    ),
    "tp": ({"layout": Layout(tp=2)}, "layout.tp differs across ranks: rank 0: 1, rank 1: 2"),
    "order": (
        {"layout": Layout(dp=2, order="tp-cp-ep-pp-dp")},
        "layout.order differs across ranks: rank 0: 'tp-cp-ep-dp-pp', rank 1: 'tp-cp-ep-pp-dp'",
    ),
    "zero_stage": (
        {"layout": Layout(dp=2, zero_stage=1)},
        "layout.zero_stage differs across ranks: rank 0: 0, rank 1: 1",
    ),
    "steps": ({"steps": STEPS + 1}, "steps differs across ranks: rank 0: 2, rank 1: 3"),
    "save_to": (
        {"save_to": "FOLDER", "save_after": 1},
        "save_to differs across ranks: rank 0: None, rank 1: '",
    ),
    "save_after": (  # every rank saves to FOLDER, after step 1 but rank 1
        {"save_after": 2},
        "save_after differs across ranks: rank 0: 1, rank 1: 2",
    ),
    "resume_from": ({"resume_from": "FOLDER"}, "resume_from differs across ranks: rank 0: None"),
    "model": ({"seed": 1}, "the model's tok.weight differs across ranks: rank 1's differs"),
    "config": (
        {"config": GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)},
        "the model's config.layers differs across ranks: rank 0: 2, rank 1: 4",
    ),
}
SAVING = {"save_to": "FOLDER", "save_after": 1}  # every rank's options in case "save_after"
HINT = "; every rank must call train with the same model and arguments"


def _options(rank: int, case: str, folder: str) -> dict:
    options = {**BASE, **(SAVING if case == "save_after" else {})}
    options.update(CASES[case][0] if rank == 1 else {})
    return {k: folder if v == "FOLDER" else v for k, v in options.items()}


def _call_train(options: dict):
    from distlab.parallel.compose import train

    config = options["config"]
    tokens, targets = (t.clone() for t in gpt_batch(options["batch"], config, seed=1))
    if options["changed"] is not None:  # one token, to the next id
        name, row = options["changed"]
        batch = tokens if name == "tokens" else targets
        batch[row, 5] = (batch[row, 5] + 1) % config.vocab
    return train(
        GPT(config, seed=options["seed"]),
        options["layout"],
        tokens,
        targets,
        **{k: options[k] for k in ("steps", "lr", "optimizer", "save_to", "save_after")},
        resume_from=options["resume_from"],
    )


def _every_case(rank, world_size, folder):
    """{case: (this rank's error message, seconds)}."""
    torch.set_num_threads(1)
    outcomes = {}
    for case in CASES:
        start = time.perf_counter()
        try:
            _call_train(_options(rank, case, folder))
            message = None
        except ValueError as error:
            message = str(error)
        outcomes[case] = (message, time.perf_counter() - start)
    try:  # the helper itself: rank 1 compares one value more (another version of the code)
        check_same_across_ranks({"a": 1, **({"b": 2} if rank == 1 else {})})
        outcomes["different names"] = (None, 0.0)
    except ValueError as error:
        outcomes["different names"] = (str(error), 0.0)
    return outcomes


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("agreement") / "checkpoint")
    results = distlab.run(_every_case, 2, args=(folder,), timeout=60, show_output=False)
    return folder, results


@pytest.mark.parametrize("case", list(CASES))
def test_a_rank_with_another_argument_fails_every_rank_with_what_differs(job, case):
    _, results = job
    messages = [outcomes[case][0] for outcomes in results]
    assert messages[0] is not None, f"{case}: train accepted ranks that disagree"
    assert messages[1] == messages[0], "every rank raises the same error"
    assert messages[0].startswith(CASES[case][1]), messages[0]
    assert messages[0].endswith(HINT)
    assert all(outcomes[case][1] < 10 for outcomes in results), "refused at once"


def test_the_first_differing_value_is_named_with_each_rank_s_value(job):
    folder, results = job
    [save_to] = {outcomes["save_to"][0] for outcomes in results}
    assert save_to == f"save_to differs across ranks: rank 0: None, rank 1: {folder!r}{HINT}"
    [names] = {outcomes["different names"][0] for outcomes in results}
    assert names.startswith(
        "the ranks compared different lists of values (rank 0: nothing more, rank 1: b)"
    )


def _agreeing(rank, world_size):
    torch.set_num_threads(1)
    return _call_train(BASE).losses


def test_ranks_that_agree_train_as_one_process():
    model = GPT(CONFIG, seed=0)
    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    expected = []
    for _ in range(STEPS):  # plain SGD, as train's default optimizer (PlainSGD)
        model.zero_grad(set_to_none=True)
        loss = model.loss(tokens, targets)
        loss.backward()
        expected.append(loss.item())
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
    for losses in distlab.run(_agreeing, 2, timeout=60, show_output=False):
        assert losses == pytest.approx(expected, rel=1e-5)


def _lr_of_rank(rank, world_size):
    torch.set_num_threads(1)
    _call_train({**BASE, "lr": 0.2 if rank == 1 else LR})


def test_an_uncaught_disagreement_ends_the_job_with_the_value_error_not_a_timeout():
    with pytest.raises(distlab.RankError) as failure:  # a LaunchTimeoutError fails the test
        distlab.run(_lr_of_rank, 2, timeout=60, show_output=False)
    message = f"ValueError: lr differs across ranks: rank 0: 0.1, rank 1: 0.2{HINT}"
    assert failure.value.exc_type == "ValueError"
    assert message.removeprefix("ValueError: ") in failure.value.remote_traceback
    assert {o.error for o in failure.value.outcomes if o.status == "raised"} == {message}


def test_describe_is_exact():
    tokens, _ = gpt_batch(BATCH, CONFIG, seed=1)
    changed = tokens.clone()
    changed[7, 7] += 1
    assert describe("t", tokens)[0][2] != describe("t", changed)[0][2]
    assert describe("t", tokens)[0][2] != describe("t", tokens.int())[0][2]
    assert describe("t", tokens)[0][1] == "int64 (8, 8)"
    assert describe("lr", LR) != describe("lr", math.nextafter(LR, 1.0))
    assert [row[0] for row in describe("layout", Layout())][:2] == ["layout.tp", "layout.cp"]


def test_the_error_lists_each_disagreeing_rank_and_what_it_had():
    def tables(values):  # one table per rank, as the exchange delivers them
        return [describe("x", v) for v in values]

    assert first_difference(tables([0.1, 0.1, 0.1])) is None
    assert first_difference(tables([0.1, 0.1, 0.2, 0.3])) == (
        "x differs across ranks: rank 0: 0.1, rank 2: 0.2, rank 3: 0.3"
    )
    assert first_difference(tables([0] + list(range(1, 8)))) == (
        "x differs across ranks: rank 0: 0, rank 1: 1, rank 2: 2, rank 3: 3, rank 4: 4 "
        "and 3 more ranks"
    )
    batch = torch.zeros(2, 3, dtype=torch.int64)
    others = [batch, batch, batch + 1, batch + 2, batch[:1]]
    assert first_difference(tables(others), "the ranks of the dp group") == (
        "x differs across the ranks of the dp group: rank 0: int64 (2, 3), rank 4: int64 (1, 3); "
        "those of ranks 2, 3 differ from rank 0's (int64 (2, 3))"
    )
