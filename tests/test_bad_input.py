"""Bad input at the training entry points is refused with an error that names the value.

Each case here was once accepted quietly (``steps=-1`` returned no losses, ``lr=nan``
trained, a routing capacity of 0 dropped every token) or failed deep inside torch with
a message naming neither the value nor what is allowed (``('grad', 0, 0)``, ``index out
of range in self``, a batch-size mismatch in one rank's loss). Checks that run before
any communication are called in this process; the pipeline checks need ranks and run
under ``distlab.run`` on two gloo processes.

The last section ("No input hangs or traces back") holds the API side of sizes that used
to run for minutes (pipeline schedules, a YAML alias bomb), layouts that were accepted
half-checked, and flashcards input that ended in a traceback; the CLI side is in
``tests/test_cli_bad_values.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

import distlab
from distlab.models import GPT, MLP, GPTConfig, gpt_batch
from distlab.parallel.compose.three_d import train_3d
from distlab.parallel.data import training
from distlab.parallel.moe.gpt import MoEConfig, MoEGPT
from distlab.parallel.moe.layer import MoE, route
from distlab.parallel.pipeline.partition import GPTEmbedding

CONFIG = GPTConfig(layers=2)  # vocab 64, seq_len 16
TOKENS, TARGETS = gpt_batch(4, CONFIG)
RUN_3D = {"tp": 1, "pp": 1, "dp": 1, "micro_batches": 1, "steps": 1, "lr": 0.1}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"steps": -1}, r"steps must be an integer >= 1, got -1"),
        ({"steps": 0}, r"steps must be an integer >= 1, got 0"),
        ({"lr": math.nan}, r"lr must be a finite number > 0, got nan"),
        ({"lr": -0.1}, r"lr must be a finite number > 0, got -0.1"),
    ],
)
def test_train_3d_refuses_steps_and_lr(change, match):
    with pytest.raises(ValueError, match=match):
        train_3d(CONFIG, TOKENS, TARGETS, **{**RUN_3D, **change})


def test_train_3d_refuses_tokens_longer_than_seq_len():
    tokens, targets = gpt_batch(4, GPTConfig(layers=2, seq_len=20))
    with pytest.raises(ValueError, match=r"sequence length 20 exceeds config.seq_len=16"):
        train_3d(CONFIG, tokens, targets, **RUN_3D)


def test_train_3d_refuses_targets_of_another_shape():
    with pytest.raises(ValueError, match=r"targets of shape \(2, 16\) do not match tokens"):
        train_3d(CONFIG, TOKENS, TARGETS[:2], **RUN_3D)


def test_compose_train_refuses_nan_lr():
    from distlab.core.layout import Layout
    from distlab.parallel.compose import train

    with pytest.raises(ValueError, match=r"lr must be a finite number > 0, got nan"):
        train(MoEGPT(CONFIG, MoEConfig()), Layout(), TOKENS, TARGETS, steps=1, lr=math.nan)


@pytest.mark.parametrize("lr", [math.nan, math.inf, 0.0])
def test_training_build_refuses_lr(lr):
    """torch's own SGD refuses only lr < 0: with lr=nan it would train to nan weights."""
    with pytest.raises(ValueError, match=rf"lr must be a finite number > 0, got {lr!r}"):
        training.build("single", MLP(), optimizer_class=torch.optim.SGD, lr=lr)


def test_training_build_refuses_unknown_method_and_non_module():
    with pytest.raises(ValueError, match=r"method must be one of .* got 'ddp'"):
        training.build("ddp", MLP(), lr=0.1)
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got list"):
        training.build("single", [torch.zeros(2)], lr=0.1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"top_k": 1, "capacity": 0}, r"capacity must be an integer >= 1, got 0"),
        ({"top_k": 1, "capacity": -3}, r"capacity must be an integer >= 1, got -3"),
        ({"top_k": 5, "capacity": 2}, r"top_k must be an integer in 1..4 \(the experts\), got 5"),
    ],
)
def test_route_refuses_capacity_and_top_k(kwargs, match):
    logits = torch.randn(8, 4)
    with pytest.raises(ValueError, match=match):
        route(logits, **kwargs)


def test_route_capacity_one_keeps_tokens():
    """The boundary that is allowed: one slot per expert keeps one token per expert."""
    routing = route(torch.randn(8, 4), top_k=1, capacity=1)
    assert routing.kept.tolist() == [min(1, n) for n in routing.routed.tolist()]


def test_moe_refuses_capacity_factor_zero_as_route_refuses_capacity_zero():
    with pytest.raises(ValueError, match=r"capacity_factor must be a finite number > 0, got 0"):
        MoE(8, 16, 4, capacity_factor=0)


@pytest.mark.parametrize(
    ("tokens", "error", "match"),
    [
        (torch.zeros(2, 17, dtype=torch.long), ValueError, r"sequence length 17 exceeds"),
        (torch.full((2, 4), 64), ValueError, r"token id 64 is outside the vocabulary \[0, 64\)"),
        (torch.full((2, 4), -1), ValueError, r"token id -1 is outside the vocabulary"),
        (torch.zeros(2, 4), TypeError, r"tokens must hold integer token ids, got dtype"),
        (
            torch.zeros(8, dtype=torch.long),
            ValueError,
            r"must have shape \(batch, seq\), got \(8,\)",
        ),
    ],
)
@pytest.mark.parametrize("entry", ["GPT", "GPTEmbedding"])
def test_model_forward_refuses_bad_tokens(entry, tokens, error, match):
    """The model's forward and the pipeline's first layer, instead of torch's
    ``index out of range in self``."""
    model = GPT(CONFIG)
    layer = model if entry == "GPT" else GPTEmbedding(model)
    with pytest.raises(error, match=match):
        layer(tokens)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 2, "stages": 2}, r"rank \(the stage\) must be an integer in 0..1, got 2"),
        ({"rank": -1, "stages": 2}, r"rank \(the stage\) must be an integer in 0..1, got -1"),
        ({"rank": 0, "stages": 0}, r"stages must be an integer >= 1, got 0"),
        ({"rank": 0, "stages": 2, "chunks": 0}, r"chunks must be an integer >= 1, got 0"),
    ],
)
def test_gpt_stage_refuses_rank_outside_the_stages(kwargs, match):
    """Rank 2 of 2 stages was an IndexError, rank -1 quietly took the last stage's layers."""
    from distlab.parallel.pipeline import gpt_stage

    with pytest.raises(ValueError, match=match):
        gpt_stage(GPT(CONFIG), **kwargs)


# -- pipeline checks that need the ranks ---------------------------------------------


def mismatched_pipeline(rank, world_size, case):
    """Each rank runs one pipeline step, with one thing wrong on some rank; returns the
    error message each rank raised (so the test sees every rank's, not only the first)."""
    from distlab.parallel.pipeline import build, gpt_stage, run_pipeline

    stages = 4 if case == "stage cut for 4" else world_size
    stage = gpt_stage(GPT(CONFIG, seed=0), rank, stages) if stages == world_size else None
    if stage is None:  # cut for 4 stages, this rank's part of the first two
        stage = gpt_stage(GPT(GPTConfig(layers=4), seed=0), rank, 4)
    m = 2 + 2 * rank if case == "micro-batches differ" else 2
    tokens, targets = gpt_batch(4, CONFIG)
    try:
        run_pipeline(build("1f1b", world_size, m), stage, tokens, targets)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.slow
def test_stage_cut_for_more_stages_than_the_schedule():
    messages = distlab.run(mismatched_pipeline, 2, args=("stage cut for 4",), timeout=120)
    for rank, message in enumerate(messages):
        assert f"stage {rank} of 4" in message and "schedule has 2 stages" in message, message


def test_micro_batch_counts_differ_across_ranks():
    """Every rank raises the same error naming both counts; none hangs, none reaches the loss."""
    messages = distlab.run(mismatched_pipeline, 2, args=("micro-batches differ",), timeout=120)
    assert messages[0] == messages[1], messages
    assert "stage 0 (rank 0): 2 stages x 1 chunks, micro_batches=2" in messages[0]
    assert "stage 1 (rank 1): 2 stages x 1 chunks, micro_batches=4" in messages[0]


def test_agreeing_ranks_run():
    """The check lets a correct pipeline through (both ranks agree)."""
    assert distlab.run(mismatched_pipeline, 2, args=("none",), timeout=120) == [None, None]


# -- "No input hangs or traces back": sizes, layouts and flashcards input ----------------------
ALIAS_BOMB = "\n".join(
    ["topic: bomb", "title: Bomb", "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    + ["cards: *l9", ""]
)  # 9**10 leaves once expanded, 13 short lines as written


def test_bubble_closed_forms_answer_at_once_for_any_size(monkeypatch):
    """The closed forms build no schedule (a V-shaped one used to be built just to check m:
    without end, and out of memory, at p = 10^6)."""
    from distlab.calc import pipeline
    from distlab.calc.pipeline import bubble_fraction, in_flight_micro_batches

    def no_build(*args, **kwargs):
        raise AssertionError(f"a closed form built a schedule: build{args}")

    monkeypatch.setattr(pipeline, "build", no_build)
    p, m = 99_999_999_999, 8
    assert bubble_fraction(p, m) == (p - 1) / (m + p - 1)
    assert bubble_fraction(p, m, relative_to="ideal") == (p - 1) / m
    assert in_flight_micro_batches(p, m, schedule="interleaved", virtual_stages=2) == 8
    p, m = 10**6, 2 * 10**6  # m >= 2p: DualPipe(V) can be built, but is not
    assert bubble_fraction(p, m, schedule="dualpipe_v") == (p - 1) / (6 * m + p - 1)
    assert in_flight_micro_batches(p, m, schedule="dualpipe") == p + 1
    with pytest.raises(ValueError, match=r"DualPipeV needs micro_batches >= 2 \* stages = 8"):
        bubble_fraction(4, 6, schedule="dualpipe_v")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda ps: ps.one_f_one_b(ps.MAX_STAGES + 1, 1),
            r"stages=257 is more than the 256 stages",
        ),
        (
            lambda ps: ps.gpipe(16, 4097),
            r"stages=16 x micro_batches=4097 x chunks=1 = 65,552 slots is more than the 65,536",
        ),
        (lambda ps: ps.build("interleaved", 16, 2048, chunks=4), r"chunks=4 = 131,072 slots"),
        (lambda ps: ps.stage_to_rank(ps.MAX_STAGES + 1, 1), r"stages=257 is more than"),
        (lambda ps: ps.PipelineSchedule.parse("0F0 0B0 65536F0"), r"chunks=65537 = 65,537 slots"),
    ],
    ids=["stages", "slots", "slots-with-chunks", "stage_to_rank", "parsed-chunk"],
)
def test_schedules_larger_than_the_limit_are_refused(call, match):
    """A schedule lists every action: past MAX_STAGES stages or MAX_SLOTS slots it is refused
    with the limit in the message, instead of being built (and replayed) for minutes."""
    from distlab.core import pipeline_schedule

    with pytest.raises(ValueError, match=match):
        call(pipeline_schedule)


def test_schedule_ops_names_the_closed_forms_when_refusing():
    from distlab.calc.pipeline import schedule_ops

    with pytest.raises(ValueError, match=r"stages=257 is more .*closed forms .* take any size"):
        schedule_ops(257, 8)


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"tp": 10**30}, ValueError, r"tp=10{30} is more than 262,144, .*allowed: tp in 1..262144"),
        ({"virtual_stages": 2**19, "pp": 2}, ValueError, r"virtual_stages=524288 is more than"),
        ({"tp": 1024, "dp": 1024}, ValueError, r"= 1,048,576 ranks is more than the 262,144"),
        ({"zero_stage": 1.5}, ValueError, r"zero_stage must be an integer in 0..3, got 1.5"),
        ({"zero_stage": True}, TypeError, r"zero_stage must be an integer in 0..3, got True"),
        ({"micro_batches": "4"}, TypeError, r"micro_batches must be an integer >= 1, got '4'"),
        ({"order": "tp-dp"}, ValueError, r"order 'tp-dp' leaves out cp, ep, pp; name every"),
        ({"order": "tp-tp-cp-ep-dp-pp"}, ValueError, r"repeats a dimension"),
        ({"schedule": ["1f1b"]}, ValueError, r"unknown schedule \['1f1b'\]; allowed: gpipe"),
    ],
)
def test_layout_refuses_bad_settings(settings, error, match):
    from distlab.core.layout import Layout

    with pytest.raises(error, match=match):
        Layout(**settings)


def test_layout_stores_ints_and_a_full_lower_case_order():
    """A whole float is an int (the one integer rule of distlab.core.checks), never stored
    as a float: ``Layout(zero_stage=1.0)`` used to keep ``1.0``."""
    from distlab.core.layout import Layout

    layout = Layout(tp=2.0, zero_stage=1.0, micro_batches=4.0, order="DP-tp-cp-ep-pp")
    assert (layout.tp, layout.zero_stage, layout.micro_batches) == (2, 1, 4)
    assert all(type(v) is int for v in (layout.tp, layout.zero_stage, layout.micro_batches))
    assert layout.order == "dp-tp-cp-ep-pp"
    assert layout == Layout(tp=2, zero_stage=1, micro_batches=4, order="dp-tp-cp-ep-pp")


def test_layout_fields_are_keyword_only():
    from distlab.core.layout import Layout

    with pytest.raises(TypeError, match="positional"):
        Layout(2, 2)


@pytest.mark.timeout(20)
def test_card_file_with_an_alias_bomb_is_refused_unexpanded(tmp_path):
    from flashcards.model import DeckError, load_deck

    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(DeckError, match=r"bomb.yaml: line 3: YAML anchor &l0 is not allowed: card files may not use anchors or aliases"):  # fmt: skip
        load_deck(path)


def test_card_file_with_one_alias_is_refused(tmp_path):
    """Even a harmless alias: card files write every value out."""
    from flashcards.model import DeckError, load_card_file

    path = tmp_path / "alpha.yaml"
    path.write_text("topic: alpha\ntitle: &t Alpha\ncards: []\nx: *t\n")
    with pytest.raises(DeckError, match=r"alpha.yaml: line 2: YAML anchor &t is not allowed"):
        load_card_file(path)


def test_review_store_that_is_not_sqlite_names_file_and_variable(tmp_path, monkeypatch):
    """The user's file is named, with the variable that pointed at it, and left untouched."""
    from flashcards.store import DB_ENV_VAR, Store

    garbage = tmp_path / "reviews.db"
    garbage.write_bytes(b"not a database\n" * 200)
    monkeypatch.setenv(DB_ENV_VAR, str(garbage))
    with pytest.raises(ValueError, match=rf"review store {garbage}, set by \$DISTLAB_FLASHCARDS_DB, is not a SQLite database .*move it away, or point \$DISTLAB_FLASHCARDS_DB"):  # fmt: skip
        Store()
    with pytest.raises(ValueError, match=rf"review store {garbage}, given with --db"):
        Store(garbage)
    assert garbage.read_bytes() == b"not a database\n" * 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reviews.db"]


def test_export_apkg_refuses_a_missing_folder(tmp_path):
    from flashcards.anki import export_apkg
    from flashcards.model import load_deck

    folder = tmp_path / "no-such-folder"
    with pytest.raises(ValueError, match=rf"the folder {folder} does not exist; create it first"):
        export_apkg(load_deck(), folder / "deck.apkg")
    assert not folder.exists()
