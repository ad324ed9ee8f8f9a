"""Checkpoints of any layout (:mod:`distlab.parallel.compose.checkpoint`), on 8 gloo processes.

* **Resume bit for bit**: train N = 6 steps saving after step 3, then a fresh launch
  resumes from the checkpoint for 3 steps: its losses and every rank's final
  parameters are *equal* (not close) to the uninterrupted run's. Two layouts:
  TP2 x PP2 x DP2 with momentum SGD, and TP1 x PP2 x DP4 with ZeRO-1, Adam and
  dropout 0.1 (the Adam moments sharded over dp, the dropout masks drawn from the
  restored generators). Not dropout with tp = 2: ``parallelize`` gives the blocks no
  RNG tracker, so each tp rank drops other elements of the replicated activations
  and the replicated parameters (LayerNorms, biases) drift apart between tp ranks;
  a checkpoint keeps one copy of them. And three more, bit for bit: MoE experts over
  ep (TP2 x EP2 x PP2 x DP2), FSDP (ZeRO-3 over dp), an interleaved pipeline with
  sequence parallelism (two model chunks per rank) and DualPipe (two chunks per rank in
  a V, each model part held by two mirror ranks and stored once).
* **Another layout**: the checkpoint of TP2 x PP2 x DP2 resumed as TP1 x PP2 x DP4,
  and the checkpoint of TP1 x PP2 x DP4 as TP2 x PP2 x DP2, each continues equal
  (rtol 1e-5: the pieces add in another order) to the uninterrupted run.
* **Each tensor once**: the pieces in the manifest cover every dense parameter once.
* **Bad input**, refused by name on every rank: a missing folder, an unfinished save,
  a damaged file, a data-parallel checkpoint, another model, another optimizer; and a
  save that dies before its commit leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from gpt_models import make_model

import distlab
from distlab.core.layout import Layout
from distlab.models import GPTConfig

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
DROPOUT = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4, dropout=0.1)
BATCH, STEPS, SAVE_AFTER, LR = 8, 6, 3, 0.1

TP2_PP2_DP2 = Layout(tp=2, pp=2, dp=2, micro_batches=2)
TP1_PP2_DP4 = Layout(pp=2, dp=4, micro_batches=2)
ZERO1 = TP1_PP2_DP4.with_(zero_stage=1)


UNTIED = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4, tie_embeddings=False)
# issue 39: the layouts whose checkpoints were checked by hand only (as in tests/test_compose.py)
MORE_LAYOUTS = {
    "tp2_ep2_pp2_dp2": (Layout(tp=2, ep=2, pp=2, dp=2, micro_batches=2), CONFIG, 1.25),
    "tp2_pp2_dp2_fsdp": (Layout(tp=2, pp=2, dp=2, zero_stage=3, micro_batches=2), UNTIED, None),
    "tp2sp_pp2_dp2_interleaved": (
        Layout(tp=2, pp=2, dp=2, sequence_parallel=True, virtual_stages=2, micro_batches=2),
        CONFIG,
        None,
    ),
    # chunks in a V, and two copies of each part (the mirror ranks hold the same pieces)
    "tp2_pp2_dp2_dualpipe": (
        Layout(tp=2, pp=2, dp=2, schedule="dualpipe", micro_batches=4),
        CONFIG,
        None,
    ),
}


def _train(rank, world_size, layout, config, optimizer, lr, steps, options, capacity=None):
    torch.set_num_threads(1)
    torch.manual_seed(rank)  # the dropout masks of an uninterrupted run, the same every time
    from distlab.models import gpt_batch
    from distlab.parallel.compose import train

    tokens, targets = gpt_batch(BATCH, config, seed=1)
    # capacity: MoE blocks, experts over ep
    model = make_model(config, None if capacity is None else {"capacity_factor": capacity})
    return train(model, layout, tokens, targets, steps=steps, lr=lr, optimizer=optimizer, **options)


def launch(
    layout, steps, *, config=CONFIG, optimizer="sgd_momentum", lr=LR, capacity=None, **options
):
    """``train`` on 8 processes; ``options``: save_to/save_after/resume_from (as str);
    ``capacity``: an MoE model with this capacity factor."""
    options = {k: str(v) if k != "save_after" else v for k, v in options.items()}
    args = (layout, config, optimizer, lr, steps, options, capacity)
    return distlab.run(_train, layout.world_size, args=args, timeout=600)


def losses(runs) -> list[float]:
    """The whole-batch losses (every last-stage rank reports the same)."""
    return next(run.losses for run in runs if run.losses is not None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Uninterrupted 6-step runs of both layouts, each saving after step 3."""
    folder = tmp_path_factory.mktemp("checkpoints")
    runs = {}
    for name, layout in (("tp2", TP2_PP2_DP2), ("tp1", TP1_PP2_DP4)):
        path = folder / name
        runs[name] = (path, launch(layout, STEPS, save_to=path, save_after=SAVE_AFTER))
    return runs


def assert_same_run(resumed, uninterrupted, *, exact: bool, what: str):
    """The resumed run's losses are the uninterrupted run's last ones, and each rank's
    parameters its counterpart's (``exact``: bit for bit, else rtol 1e-5)."""
    want = losses(uninterrupted)[SAVE_AFTER:]
    if exact:
        assert losses(resumed) == want, what
    else:
        assert losses(resumed) == pytest.approx(want, rel=1e-5), what
    assert want[-1] < losses(uninterrupted)[0], f"{what}: the run does not train"
    for got, ref in zip(resumed, uninterrupted, strict=True):
        assert got.coordinates == ref.coordinates and set(got.shards) == set(ref.shards)
        for name, value in got.shards.items():
            if exact:
                assert torch.equal(value, ref.shards[name]), f"{what}: rank {got.rank}, {name}"
            else:
                torch.testing.assert_close(
                    value, ref.shards[name], rtol=1e-5, atol=1e-5,
                    msg=lambda m, n=name, r=got.rank: f"{what}: rank {r}, {n}: {m}",
                )  # fmt: skip


@pytest.mark.slow
def test_resume_in_the_same_layout_is_bit_exact(saved):
    path, uninterrupted = saved["tp2"]
    resumed = launch(TP2_PP2_DP2, STEPS - SAVE_AFTER, resume_from=path)
    assert_same_run(resumed, uninterrupted, exact=True, what="TP2 x PP2 x DP2")


@pytest.mark.slow
def test_resume_with_zero1_adam_and_dropout_is_bit_exact(tmp_path):
    kw = {"config": DROPOUT, "optimizer": "adam", "lr": 0.01}
    path = tmp_path / "zero1"
    uninterrupted = launch(ZERO1, STEPS, save_to=path, save_after=SAVE_AFTER, **kw)
    resumed = launch(ZERO1, STEPS - SAVE_AFTER, resume_from=path, **kw)
    assert_same_run(resumed, uninterrupted, exact=True, what=ZERO1.label())


@pytest.mark.slow
@pytest.mark.parametrize(("source", "target"), [("tp2", "tp1"), ("tp1", "tp2")])
def test_resume_in_another_layout_continues_the_run(saved, source, target):
    path, _ = saved[source]
    layout = {"tp2": TP2_PP2_DP2, "tp1": TP1_PP2_DP4}[target]
    resumed = launch(layout, STEPS - SAVE_AFTER, resume_from=path)
    # the uninterrupted run of the target layout holds the same slices; its losses
    # equal the source's up to rounding (both equal one process, tests/test_compose.py)
    assert_same_run(resumed, saved[target][1], exact=False, what=f"{source} -> {target}")
    source_losses = losses(saved[source][1])[SAVE_AFTER:]
    assert losses(resumed) == pytest.approx(source_losses, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MORE_LAYOUTS))
def test_resume_ep_fsdp_and_pipelined_layouts_bit_exact(name, tmp_path):
    """MoE experts over ep, FSDP's flat shards, two model chunks per pipeline rank (looped
    or in DualPipe's V): saved after step 3 and resumed, each continues bit for bit."""
    layout, config, capacity = MORE_LAYOUTS[name]
    kw = {"config": config, "capacity": capacity}
    uninterrupted = launch(layout, STEPS, save_to=tmp_path, save_after=SAVE_AFTER, **kw)
    resumed = launch(layout, STEPS - SAVE_AFTER, resume_from=tmp_path, **kw)
    assert_same_run(resumed, uninterrupted, exact=True, what=layout.label())


@pytest.mark.slow
def test_each_dense_tensor_is_stored_once(saved):
    from distlab.models import GPT
    from distlab.parallel.compose.checkpoint import read_manifest

    manifest = read_manifest(saved["tp2"][0])
    assert manifest["step"] == SAVE_AFTER and manifest["layout"]["tp"] == 2
    dense = dict(GPT(CONFIG).named_parameters(remove_duplicate=False))
    assert set(manifest["pieces"]) == set(dense)  # the tied head.weight: the last stage's copy
    for name, pieces in manifest["pieces"].items():
        stored = sum(torch.Size([hi - lo for lo, hi in p["box"]]).numel() for p in pieces)
        assert stored == dense[name].numel(), name
    assert len(manifest["pieces"]["blocks.0.attn.q.weight"]) == 2  # one per tp rank
    assert len(manifest["pieces"]["blocks.0.ln1.weight"]) == 1  # whole on every rank
    writers = {p["file"] for pieces in manifest["pieces"].values() for p in pieces}
    assert len(writers) == 8, "the writing is spread over the ranks"


def _bad_inputs(rank, world_size, good, scratch):
    torch.set_num_threads(1)
    from distlab.models import GPT
    from distlab.parallel.checkpoint import files as checkpoint_files
    from distlab.parallel.compose import make_optimizer, parallelize
    from distlab.parallel.compose.checkpoint import load_checkpoint, save_checkpoint

    model = GPT(CONFIG, seed=0)
    parallel = parallelize(model, TP2_PP2_DP2)
    optimizer, _ = make_optimizer(parallel, "sgd_momentum", LR)
    refused = {}

    def attempt(case, path, dense=model, optim=optimizer):
        try:
            load_checkpoint(path, parallel, optim, dense)
        except ValueError as exc:  # CheckpointError is a ValueError
            refused[case] = (type(exc).__name__, str(exc))
        else:
            refused[case] = None

    if rank == 0:
        for case in ("incomplete", "damaged", "crashed"):
            shutil.copytree(good, f"{scratch}/{case}")
        (scratch / "incomplete" / "COMMIT.json").unlink()
        victim = next((scratch / "damaged").glob("data-*/rank-00005.pt"))
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(data)
        foreign = scratch / "foreign" / "data-0"  # committed, but not by save_checkpoint
        foreign.mkdir(parents=True)
        (foreign / "weights.bin").write_bytes(b"\0" * 64)
        described = checkpoint_files.describe_files(foreign, ["weights.bin"])
        checkpoint_files.write_commit(foreign.parent, foreign.name, described, world_size)
    torch.distributed.barrier()
    attempt("missing", scratch / "nothing-here")
    attempt("incomplete", scratch / "incomplete")
    attempt("damaged", scratch / "damaged")
    other = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
    attempt("model", good, dense=GPT(other, seed=0))
    attempt("optimizer", good, optim=make_optimizer(parallel, "adam", LR)[0])
    attempt("foreign", scratch / "foreign")

    def disk_full(*args):
        raise OSError("disk full")

    # a save that dies after writing its data, before its commit
    real_describe = checkpoint_files.describe_files
    checkpoint_files.describe_files = disk_full
    try:
        save_checkpoint(scratch / "crashed", parallel, optimizer, model, step=99)
    except OSError:
        pass
    finally:
        checkpoint_files.describe_files = real_describe
    torch.distributed.barrier()
    folders = len(list((scratch / "crashed").glob("data-*")))
    step = load_checkpoint(scratch / "crashed", parallel, optimizer, model)
    return refused, folders, step


@pytest.mark.slow
def test_bad_checkpoints_are_refused_by_name(saved, tmp_path):
    good = saved["tp2"][0]
    results = distlab.run(_bad_inputs, 8, args=(good, tmp_path), timeout=600)
    refused, folders, step = results[0]
    assert all(r[0] == refused for r in results), "every rank gives the same verdict"
    want = {
        "missing": ("CheckpointError", "nothing-here is not a checkpoint folder"),
        "incomplete": ("CheckpointError", "incomplete: COMMIT.json is missing"),
        "damaged": ("CheckpointError", "rank-00005.pt: its SHA-256 differs"),
        "model": ("ValueError", "config differs (saved value, this model's value): {'layers': (4, 2)}"),
        "optimizer": ("ValueError", "holds the state of a SGD optimizer, this run's is Adam"),
        "foreign": ("CheckpointError", "has no manifest.json"),
    }  # fmt: skip
    for case, (kind, text) in want.items():
        assert refused[case] is not None, f"{case}: loaded without complaint"
        assert refused[case][0] == kind and text in refused[case][1], (case, refused[case])
    assert folders == 2, "the dead save left its data folder beside the committed one"
    assert step == SAVE_AFTER, "the previous checkpoint still loads"
