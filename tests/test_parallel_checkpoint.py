"""Checkpoints: bit-identical resumption, and a sharded checkpoint read at another world size.

The GPT here has dropout, so each step consumes random numbers: resuming is
bit-identical only if the RNG state comes back with the weights and Adam's
m, v and step. Three launches share the work:

* 4 ranks train ZeRO-1 and FSDP, save sharded checkpoints, and report the
  whole state they saved;
* 2 ranks train DDP and FSDP (fp32, and fp16 with fp32 masters and a
  dynamic loss scale; FSDP's through its MixedPrecisionPolicy) and ZeRO-2
  for 2 steps, save full and sharded
  checkpoints, and train 2 more steps (the uninterrupted run);
* 2 fresh-state ranks (another model seed, another RNG seed) load each
  checkpoint and train the same 2 steps; they also read the 4-rank
  checkpoints (the loaded weights and Adam state must equal what 4 ranks
  saved, bit for bit) and one DDP checkpoint into ZeRO-2.
"""

from __future__ import annotations

import pytest
import torch

import distlab

FIRST, SECOND = 2, 2  # steps before and after the checkpoint
METHODS = {
    "ddp": ("bucketed_ddp", {}),
    "ddp_fp16": ("bucketed_ddp", {"fp16": True}),  # fp32 masters and a dynamic loss scale
    "zero2": ("zero2", {}),
    "fsdp": ("fsdp", {"wrap": "layer"}),
    "fsdp_fp16": ("fsdp", {"wrap": "layer", "fp16": True}),  # masters of the shards
}
RESHARD = {
    "zero1": ("zero1", {}),
    "fsdp": ("fsdp", {"wrap": "layer"}),
    "fsdp_fp16": ("fsdp", {"wrap": "layer", "fp16": True}),
}


def _setup(method, options, model_seed):
    import torch

    from distlab.models import GPT, GPTConfig
    from distlab.parallel import DynamicLossScaler, MixedPrecisionPolicy
    from distlab.parallel.data import training as T

    torch.set_num_threads(1)
    model = GPT(GPTConfig(layers=1, dropout=0.1), seed=model_seed)
    options = dict(options)
    if options.pop("fp16", False):  # a scale that doubles every step: its state matters
        if method == "fsdp":
            options["mixed_precision"] = MixedPrecisionPolicy(param_dtype=torch.float16)
        else:
            model = model.half()
        options["loss_scaler"] = DynamicLossScaler(2.0**10, growth_interval=1)
    return T.build(method, model, algorithm="builtin", lr=1e-2, **options)


def _steps(trainer, first_step, n):
    from distlab.models import GPTConfig, gpt_batch
    from distlab.parallel.data import training as T

    for step in range(first_step, first_step + n):
        T.train_step(trainer, gpt_batch(8, GPTConfig(layers=1), seed=step), T.lm_loss)


def _state(trainer):
    from distlab.parallel.checkpoint.data_parallel import full_state

    state = full_state(trainer.model, trainer.optimizer)
    out = {"params": state["params"], "optimizer": state["optimizer"]}
    scaler = getattr(trainer.optimizer, "loss_scaler", None)
    if scaler is not None:
        out["loss_scaler"] = (scaler.scale, scaler.good_steps, scaler.skipped_steps)
        out["model"] = _model_weights(trainer.model)
    return out


def _model_weights(model) -> dict:
    """The 16-bit weights the model computes with, by name (FSDP's gathered from its shards)."""
    import torch

    from distlab.parallel import FSDP
    from distlab.parallel.zero.flat import named_parameter_index

    if not isinstance(model, FSDP):
        return {n: p.detach().clone() for n, p in model.module.named_parameters()}
    names, out = named_parameter_index(model.module), {}
    for unit in model.units:  # each all-gather casts the (fp32) shard to param_dtype first
        full = torch.empty(unit.group.padded_numel, dtype=model.param_dtype)
        model.comm.all_gather(full, unit.shard.detach().to(model.param_dtype))
        for p, view in zip(unit.group.params, unit.group.views(full)):
            out[names[id(p)]] = view.clone()
    return out


def _save_at_four(rank, world_size, directory):
    import torch

    from distlab.parallel import save_sharded

    out = {}
    for name, (method, options) in RESHARD.items():
        torch.manual_seed(10 + rank)
        trainer = _setup(method, options, model_seed=1)
        _steps(trainer, 0, FIRST)
        save_sharded(f"{directory}/w4-{name}", trainer.model, trainer.optimizer)
        out[name] = _state(trainer)
    return out


def _train_and_save(rank, world_size, directory):
    import torch

    from distlab.parallel import save_full, save_sharded

    out = {}
    for name, (method, options) in METHODS.items():
        torch.manual_seed(10 + rank)
        trainer = _setup(method, options, model_seed=1)
        _steps(trainer, 0, FIRST)
        save_full(f"{directory}/{name}.pt", trainer.model, trainer.optimizer)
        save_sharded(f"{directory}/{name}-sharded", trainer.model, trainer.optimizer)
        out[name + "@save"] = _state(trainer)
        _steps(trainer, FIRST, SECOND)
        after = _state(trainer)
        out[name] = {k: after[k] for k in ("params", "loss_scaler") if k in after}
    return out


def _resume(rank, world_size, directory):
    import torch

    from distlab.parallel import load_full, load_sharded

    out = {}
    for name, (method, options) in METHODS.items():
        for kind, load, path in [
            ("full", load_full, f"{directory}/{name}.pt"),
            ("sharded", load_sharded, f"{directory}/{name}-sharded"),
        ]:
            torch.manual_seed(999)  # a different RNG state, which loading must replace
            trainer = _setup(method, options, model_seed=7)
            load(path, trainer.model, trainer.optimizer)
            _steps(trainer, FIRST, SECOND)
            after = _state(trainer)
            out[(name, kind)] = {k: after[k] for k in ("params", "loss_scaler") if k in after}
    for name, (method, options) in RESHARD.items():
        torch.manual_seed(10 + rank)
        trainer = _setup(method, options, model_seed=7)
        load_sharded(f"{directory}/w4-{name}", trainer.model, trainer.optimizer)
        out[("w4", name)] = _state(trainer)
    trainer = _setup("bucketed_ddp", {}, model_seed=7)
    load_full(f"{directory}/ddp.pt", trainer.model, trainer.optimizer)
    torch.manual_seed(999)  # throw the restored RNG state away
    _steps(trainer, FIRST, SECOND)
    out["ddp without rng"] = _state(trainer)["params"]
    trainer = _setup("zero2", {}, model_seed=7)
    load_full(f"{directory}/ddp.pt", trainer.model, trainer.optimizer)
    out["ddp->zero2"] = _state(trainer)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("checkpoints")
    at_four = distlab.run(_save_at_four, 4, args=(str(directory),), timeout=240)
    saved = distlab.run(_train_and_save, 2, args=(str(directory),), timeout=240)
    resumed = distlab.run(_resume, 2, args=(str(directory),), timeout=240)
    return at_four, saved, resumed


def _assert_equal(a: dict, b: dict, what) -> None:
    assert a.keys() == b.keys(), what
    for key, value in a.items():
        if isinstance(value, dict):
            _assert_equal(value, b[key], (what, key))
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), (what, key)
        else:
            assert value == b[key], (what, key)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_resuming_continues_bit_for_bit(runs, name, kind):
    _, saved, resumed = runs
    for rank in range(2):
        _assert_equal(resumed[rank][(name, kind)], saved[rank][name], (name, kind, rank))


@pytest.mark.slow
def test_resuming_without_the_rng_state_differs(runs):
    """The check above has teeth: with dropout, the steps depend on the RNG state."""
    _, saved, resumed = runs
    without = resumed[0]["ddp without rng"]
    expected = saved[0]["ddp"]["params"]
    assert any(not torch.allclose(without[k], expected[k], atol=1e-6) for k in without)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp_fp16", "fsdp_fp16"])
def test_a_mixed_precision_checkpoint_holds_the_fp32_masters_and_the_loss_scale(runs, name):
    """The fp16 model is the rounding of its masters; saving the fp16 weights would
    lose the low bits that the masters accumulate, and resumption would drift.
    FSDP's masters are its fp32 shards themselves (FSDP2), gathered by name."""
    _, saved, _ = runs
    state = saved[0][f"{name}@save"]
    assert all(v.dtype == torch.float32 for v in state["params"].values())
    assert any(not torch.equal(state["params"][n], w.float()) for n, w in state["model"].items())
    for key, weight in state["model"].items():
        assert weight.dtype == torch.float16
        assert torch.equal(state["params"][key].half(), weight)
    scale, good, skipped = state["loss_scaler"]  # doubles after each good step, halves on a skip
    assert good == 0 and scale == 2.0**10 * 2.0 ** (FIRST - skipped) * 0.5**skipped
    assert saved[0][name]["loss_scaler"] != state["loss_scaler"]  # it kept changing


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESHARD))
def test_sharded_checkpoint_from_four_ranks_loads_on_two(runs, name):
    at_four, _, resumed = runs
    for rank in range(2):
        _assert_equal(resumed[rank][("w4", name)], at_four[0][name], (name, rank))


@pytest.mark.slow
def test_full_checkpoint_moves_between_methods(runs):
    _, saved, resumed = runs
    for rank in range(2):
        _assert_equal(resumed[rank]["ddp->zero2"], saved[rank]["ddp@save"], rank)
