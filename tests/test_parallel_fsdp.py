"""FSDP as a PyTorch FSDP user expects it, on 1, 2 and 3 gloo ranks.

One launch per world size returns, for the tests below to read:

* **fp32 parity**: DDP and FSDP (per layer on distlab's ring, whole model on
  the built-in collectives, per GPT block) after two steps, next to two
  single-process references: the whole batch at once, and the K ranks' parts
  of the batch accumulated as K micro-batches (loss / K each). With two
  ranks FSDP adds the same two numbers per element as DDP and accumulation
  do, so all three are equal bit for bit; one matmul over the whole batch
  sums in another order, so neither DDP nor FSDP equals that run bit for bit
  (see the FSDP module docstring).
* **mixed precision**: bf16 and fp16 (dynamic loss scale) MLP runs of FSDP
  with a ``MixedPrecisionPolicy`` (FSDP2's design: fp32 shards, the masters,
  cast to 16 bits for each all-gather; a plain Adam on them, or for fp16 a
  ``MixedPrecisionOptimizer`` stepping them in place), DDP and single-process
  training with the same recipe (16-bit weights, fp32 masters from the fp32
  weights): parameters, which steps were skipped, memory, bytes sent.
* **overflow agreement**: an inf placed in one rank's gradient shard only.
* **gradients by name and clipping** on the GPT (tied embedding), through
  ``named_gradients()`` and through each parameter's ``.grad`` after
  ``gather_gradients()`` (clipping by hand with torch's own function).
* **fidelity to PyTorch's FSDP2** (issue 28), on an MLP whose first layer
  looks trained (weights of size 2 to 4, where one float16 ulp is 2^-9):
  fp16 masters are the fp32 weights the model was wrapped with, fp32 and fp16
  FSDP track a single-process fp32 run, and a plain torch optimizer steps the
  fp32 shards (CS336's ``test_fsdp_correctness[fp16]`` needs exactly that).

Tolerances are the data-parallel tests' (``test_parallel_methods``):
``rtol=1e-5, atol=1e-6`` in fp32, the mean weight difference below lr / 10
in 16 bits.
"""

from __future__ import annotations

import math

import pytest
import torch

import distlab
from distlab.calc.comm import data_parallel_comm
from distlab.calc.memory import get_recipe, model_state_bytes
from distlab.parallel import MixedPrecisionPolicy

WORLD_SIZES = [1, 2, 3]
BATCH = 24
STEPS = 2
MIXED_STEPS = 4
LR = 1e-2
FP16_INIT_SCALE = 2.0**20  # steps 1 and 4 overflow fp16 (the scale doubles after 2 good steps)
CLIP = 0.01  # far below the gradient norms: clipping really scales
NORM_TYPES = (2.0, math.inf, 1.0)
FIDELITY_STEPS = 3
FIDELITY_LR = 0.05
FP16_ULP_AT_2 = 2.0**-9  # float16 spacing between 2 and 4 (10 stored mantissa bits)


def _models():
    import torch

    from distlab.models import GPT, MLP, GPTBlock, GPTConfig, gpt_batch, mlp_batch
    from distlab.parallel.data import training as T

    gpt_config = GPTConfig(layers=1)
    sgd = {"optimizer_class": torch.optim.SGD, "lr": 0.2, "momentum": 0.9}
    return {
        "mlp": (lambda: MLP(seed=1), mlp_batch, T.mse_loss, {"lr": LR}, "layer"),
        "gpt": (
            lambda: GPT(gpt_config, seed=1),
            lambda n, seed: gpt_batch(n, gpt_config, seed=seed),
            T.lm_loss,
            sgd,
            (GPTBlock,),
        ),
    }


def _reference(make, batch_fn, loss_fn, options, world_size, *, parts: bool):
    """Single-process training: the whole batch, or the K ranks' parts as K micro-batches."""
    import torch

    from distlab.parallel import shard_batch

    options = dict(options)
    model = make()
    optimizer = options.pop("optimizer_class", torch.optim.Adam)(model.parameters(), **options)
    for step in range(STEPS):
        batch = batch_fn(BATCH, seed=step)
        pieces = (
            [shard_batch(batch, r, world_size) for r in range(world_size)] if parts else [batch]
        )
        optimizer.zero_grad()
        for piece in pieces:
            (loss_fn(model, piece) / len(pieces)).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _fp32_parity(world_size):
    from distlab.parallel.checkpoint.data_parallel import full_state
    from distlab.parallel.data import training as T

    out = {}
    for model_name, (make, batch_fn, loss_fn, options, unit) in _models().items():
        runs = {"ddp": ("naive_ddp", {}), "fsdp_ring": ("fsdp", {"wrap": unit})}
        if model_name == "mlp":  # the other paths once, on the cheaper model
            runs["fsdp_builtin_model"] = ("fsdp", {"wrap": "model", "algorithm": "builtin"})
            runs["fsdp_prefetch"] = ("fsdp", {"wrap": "layer", "prefetch": True})
        for run_name, (method, build_options) in runs.items():
            trainer = T.build(method, make(), **build_options, **options)
            for step in range(STEPS):
                T.train_step(trainer, batch_fn(BATCH, seed=step), loss_fn)
            out[(model_name, run_name)] = full_state(trainer.model, trainer.optimizer)["params"]
        for parts in (False, True):
            out[(model_name, "parts" if parts else "whole")] = _reference(
                make, batch_fn, loss_fn, options, world_size, parts=parts
            )
    return out


def _mixed_runs(world_size):
    """bf16 and fp16 MLP runs of single, DDP and FSDP with one recipe (fp32 masters)."""
    import torch

    from distlab.collectives import count_traffic
    from distlab.models import MLP, mlp_batch
    from distlab.parallel import DynamicLossScaler, measure_model_state
    from distlab.parallel.checkpoint.data_parallel import full_state
    from distlab.parallel.data import training as T

    out = {}
    for dtype in (torch.bfloat16, torch.float16):
        for name in ("single", "bucketed_ddp", "fsdp", "fsdp_reduce_fp32"):
            options = {"lr": LR}
            if dtype == torch.float16:
                options["loss_scaler"] = DynamicLossScaler(FP16_INIT_SCALE, growth_interval=2)
            if name.startswith("fsdp"):
                reduce_dtype = torch.float32 if name == "fsdp_reduce_fp32" else None
                policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype)
                trainer = T.build("fsdp", MLP(seed=1), mixed_precision=policy, **options)
            else:  # the same recipe by hand: cast the model, fp32 masters in the optimizer,
                trainer = T.build(name, MLP(seed=1).to(dtype), **options)
                with torch.no_grad():  # starting from the fp32 weights, as FSDP's do
                    for master, weight in zip(trainer.optimizer.masters, MLP(seed=1).parameters()):
                        master.copy_(weight)
            skipped, sent = [], []
            for step in range(MIXED_STEPS):
                scaler = getattr(trainer.optimizer, "loss_scaler", None)
                before = scaler.skipped_steps if scaler else 0
                with count_traffic() as traffic:
                    T.train_step(trainer, mlp_batch(BATCH, seed=step), T.mse_loss)
                skipped.append((scaler.skipped_steps if scaler else 0) > before)
                sent.append(dict(traffic.by_schedule))
            groups = getattr(trainer.model, "flat_groups", [])
            masters = getattr(trainer.optimizer, "masters", list(trainer.model.parameters()))
            out[(str(dtype), name)] = {
                "params": full_state(trainer.model, trainer.optimizer)["params"],
                "skipped": skipped,
                "scale": getattr(trainer.optimizer, "scale", 1.0),
                "memory": measure_model_state(trainer.model, trainer.optimizer),
                "sent": sent,
                "padded": sum(g.padded_numel for g in groups),
                "n_params": sum(p.numel() for p in MLP(seed=1).parameters()),
                "shard_dtypes": {str(p.dtype) for p in trainer.model.parameters()},
                "master_dtypes": {str(m.dtype) for m in masters},
            }
    return out


def _overflow_on_one_rank(rank, world_size):
    """An inf that lands in rank 0's gradient shard only: every rank must skip the step."""
    import torch

    from distlab.models import MLP, mlp_batch
    from distlab.parallel import DynamicLossScaler, shard_batch
    from distlab.parallel.data import training as T
    from distlab.parallel.precision.mixed_precision import grads_are_finite

    policy = MixedPrecisionPolicy(param_dtype=torch.float16)
    scaler = DynamicLossScaler(2.0**8)
    trainer = T.build("fsdp", MLP(seed=1), mixed_precision=policy, loss_scaler=scaler, lr=LR)
    fsdp, optimizer = trainer.model, trainer.optimizer
    before = [p.detach().clone() for p in fsdp.parameters()]
    optimizer.zero_grad()
    local = shard_batch(mlp_batch(BATCH, seed=0), rank, world_size)
    optimizer.scale_loss(T.mse_loss(fsdp, local)).backward()
    if rank == 0:
        fsdp.units[0].shard.grad[0] = float("inf")
    finite_here = grads_are_finite([p.grad for p in fsdp.parameters()])
    stepped = optimizer.step()
    unchanged = all(torch.equal(p, q) for p, q in zip(fsdp.parameters(), before))
    return {
        "finite_here": finite_here,
        "stepped": stepped,
        "unchanged": unchanged,
        "scale": scaler.scale,
    }


def _single_process_gradients(world_size):
    """The GPT's gradients, the ranks' parts accumulated in one process; then clipped."""
    import torch

    from distlab.models import GPT, GPTConfig, gpt_batch
    from distlab.parallel import shard_batch
    from distlab.parallel.data import training as T

    config = GPTConfig(layers=1)
    model = GPT(config, seed=1)

    def backward():
        model.zero_grad()
        for r in range(world_size):
            piece = shard_batch(gpt_batch(BATCH, config, seed=0), r, world_size)
            (T.lm_loss(model, piece) / world_size).backward()

    backward()
    out = {"grads": {n: p.grad.flatten().clone() for n, p in model.named_parameters()}}
    for norm_type in NORM_TYPES:
        backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, norm_type=norm_type)
        grads = {n: p.grad.flatten().clone() for n, p in model.named_parameters()}
        out[norm_type] = (float(total), grads)
    return out


def _gradients_and_clipping(rank, world_size):
    """Per-name gradient pieces after backward, then after clip_grad_norm_."""
    import torch

    from distlab.models import GPT, GPTBlock, GPTConfig, gpt_batch
    from distlab.parallel import FSDP, shard_batch
    from distlab.parallel.data import training as T

    config = GPTConfig(layers=1)
    fsdp = FSDP(GPT(config, seed=1), wrap=(GPTBlock,))
    local = shard_batch(gpt_batch(BATCH, config, seed=0), rank, world_size)
    out = {"clipped": {}, "errors": []}

    def backward():
        fsdp.zero_grad()
        T.lm_loss(fsdp, local).backward()

    backward()
    out["module_grads"] = [p.grad for p in fsdp.module.parameters()]
    out["grads"] = {
        name: (fsdp.shard_range(name), g.clone()) for name, g in fsdp.named_gradients().items()
    }
    # torch-style per-parameter code: full gradients in .grad, clipped by torch's function
    fsdp.gather_gradients()
    out["full_grads"] = {n: p.grad.flatten().clone() for n, p in fsdp.module.named_parameters()}
    torch.nn.utils.clip_grad_norm_(fsdp.module.parameters(), CLIP)
    out["clipped_by_hand"] = {
        n: (fsdp.shard_range(n), g.clone()) for n, g in fsdp.named_gradients().items()
    }
    fsdp(local[0])  # the next forward drops the full gradients, keeps this rank's part
    out["grads_after_forward"] = [p.grad for p in fsdp.module.parameters()]
    out["shard_grads_after_forward"] = {
        n: (fsdp.shard_range(n), g.clone()) for n, g in fsdp.named_gradients().items()
    }
    for norm_type in NORM_TYPES:
        backward()
        total = fsdp.clip_grad_norm_(CLIP, norm_type=norm_type)
        grads = {n: (fsdp.shard_range(n), g.clone()) for n, g in fsdp.named_gradients().items()}
        out["clipped"][norm_type] = (float(total), grads)
    for bad in ({"max_norm": -1.0}, {"max_norm": 1.0, "norm_type": 0}, {"max_norm": "1"}):
        try:
            fsdp.clip_grad_norm_(**bad)
        except ValueError as error:
            out["errors"].append(str(error))
    try:
        fsdp.shard_range("no.such.weight")
    except ValueError as error:
        out["errors"].append(str(error))
    try:
        FSDP(GPT(config, seed=1), mixed_precision="bf16")
    except TypeError as error:
        out["errors"].append(str(error))
    if rank == 0:
        out["reference"] = _single_process_gradients(world_size)
    return out


def _trained_mlp():
    """MLP(seed=1) whose first layer looks trained to large values: weights of size 2 to 4,
    where one float16 ulp is 2^-9 (rounding them to float16 moves them by up to 9.8e-4)."""
    import torch

    from distlab.models import MLP

    model = MLP(seed=1)
    weight = model.layers[0].weight
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        weight.copy_(weight.sign() * (2 + 2 * torch.rand(weight.shape, generator=generator)))
    return model


def _fidelity(rank, world_size):
    """fp32 and fp16 FSDP with SGD, the weights after wrapping and after each step; a
    single-process fp32 run of the ranks' parts as micro-batches; a plain torch optimizer
    on float16 shards."""
    import torch

    from distlab.models import mlp_batch
    from distlab.parallel import FSDP, shard_batch
    from distlab.parallel.checkpoint.data_parallel import full_state
    from distlab.parallel.data import training as T

    out = {"original": {n: p.detach().clone() for n, p in _trained_mlp().named_parameters()}}
    policies = {"fp32": None, "fp16": MixedPrecisionPolicy(param_dtype=torch.float16)}
    for name, policy in policies.items():
        options = {"optimizer_class": torch.optim.SGD, "lr": FIDELITY_LR}
        trainer = T.build("fsdp", _trained_mlp(), mixed_precision=policy, **options)
        states = [full_state(trainer.model, trainer.optimizer)["params"]]
        for step in range(FIDELITY_STEPS):
            T.train_step(trainer, mlp_batch(BATCH, seed=step), T.mse_loss)
            states.append(full_state(trainer.model, trainer.optimizer)["params"])
        out[name] = states
    if rank == 0:
        model = _trained_mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=FIDELITY_LR)
        states = [{n: p.detach().clone() for n, p in model.named_parameters()}]
        for step in range(FIDELITY_STEPS):
            optimizer.zero_grad()
            for r in range(world_size):
                piece = shard_batch(mlp_batch(BATCH, seed=step), r, world_size)
                (T.mse_loss(model, piece) / world_size).backward()
            optimizer.step()
            states.append({n: p.detach().clone() for n, p in model.named_parameters()})
        out["reference"] = states
    fsdp = FSDP(_trained_mlp(), mixed_precision=policies["fp16"])
    plain = torch.optim.SGD(fsdp.parameters(), lr=FIDELITY_LR)
    before = [p.detach().clone() for p in fsdp.parameters()]
    T.mse_loss(fsdp, shard_batch(mlp_batch(BATCH), rank, world_size)).backward()
    try:
        plain.step()
        out["plain_step"] = "stepped"
    except RuntimeError as error:
        out["plain_step"] = str(error)
    out["plain_unchanged"] = all(torch.equal(p, q) for p, q in zip(fsdp.parameters(), before))
    out["plain_dtypes"] = {str(p.dtype) for p in fsdp.parameters()}
    try:
        fsdp.gather_gradients()
        out["gather_gradients"] = "gathered"
    except ValueError as error:
        out["gather_gradients"] = str(error)
    return out


def _worker(rank, world_size):
    import torch

    torch.set_num_threads(1)  # one core per rank: deterministic kernels
    return {
        "fp32": _fp32_parity(world_size),
        "mixed": _mixed_runs(world_size),
        "overflow": _overflow_on_one_rank(rank, world_size),
        "named": _gradients_and_clipping(rank, world_size),
        "fidelity": _fidelity(rank, world_size),
    }


@pytest.fixture(scope="module")
def results():
    cache = {}

    def get(world_size):
        if world_size not in cache:
            cache[world_size] = distlab.run(_worker, world_size, timeout=300)
        return cache[world_size]

    return get


def _max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# ----------------------------------------------------------- fp32 parity ----
@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_fp32_fsdp_is_bitwise_equal_wherever_ddp_is(results, world_size):
    """One rank: everything equals the whole-batch run. Two ranks: FSDP, DDP and the
    two-micro-batch run are equal bit for bit, and DDP and FSDP miss the whole-batch
    run by the same amount (a matmul's summation order, not FSDP). Three ranks:
    equal to rounding (where the ring starts summing differs per element)."""
    for rank_result in results(world_size):
        fp32 = rank_result["fp32"]
        for model in ("mlp", "gpt"):
            whole, parts = fp32[(model, "whole")], fp32[(model, "parts")]
            ddp_miss = _max_difference(fp32[(model, "ddp")], whole)
            runs = [run for (m, run) in fp32 if m == model and run not in ("whole", "parts")]
            assert len(runs) == (4 if model == "mlp" else 2)
            for run in runs:
                params = fp32[(model, run)]
                if world_size == 1:
                    assert all(torch.equal(params[k], whole[k]) for k in whole), (model, run)
                elif world_size == 2:
                    assert all(torch.equal(params[k], parts[k]) for k in parts), (model, run)
                    assert _max_difference(params, whole) == ddp_miss > 0, (model, run)
                for key in whole:
                    torch.testing.assert_close(params[key], whole[key], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------- mixed precision ----
def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _mean_difference(a: dict, b: dict) -> float:
    return float(torch.cat([(a[k] - b[k]).abs().flatten() for k in a]).mean())


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_mixed_precision_fsdp_equals_the_same_recipe_without_sharding(results, world_size, dtype):
    """The recipe: 16-bit weights and compute, fp32 masters (FSDP: its fp32 shards, cast
    to 16 bits for each all-gather), fp16 with a dynamic loss scale. The two designs
    compute with the same 16-bit rounding of the same masters, so on one rank FSDP
    equals single-process training bit
    for bit, on two DDP with the same recipe (the same additions), on three DDP to
    within rounding (mean weight difference far below lr, the data-parallel tests'
    bound). bf16 stays within that bound of single-process training at every K.

    fp16 on K > 1 ranks is compared with DDP, not with one process: each rank
    scales the gradient of its *local* mean loss, K times its share of the sum, so
    it overflows at a K times smaller scale and skips steps one process does not
    (measured: single skips steps 1 and 4, two ranks steps 1 and 2)."""
    for rank_result in results(world_size):
        single = rank_result["mixed"][(dtype, "single")]
        ddp = rank_result["mixed"][(dtype, "bucketed_ddp")]
        run = rank_result["mixed"][(dtype, "fsdp")]
        assert run["shard_dtypes"] == {"torch.float32"} == run["master_dtypes"]  # FSDP2
        assert all(v.dtype == torch.float32 for v in run["params"].values())  # the masters
        assert run["skipped"] == ddp["skipped"] and run["scale"] == ddp["scale"]
        if world_size == 1:
            assert _same(run["params"], single["params"]) and run["skipped"] == single["skipped"]
        elif world_size == 2:
            assert _same(run["params"], ddp["params"])
        assert _mean_difference(run["params"], ddp["params"]) < LR / 10
        if dtype == "torch.bfloat16":
            assert _mean_difference(run["params"], single["params"]) < LR / 10
            assert not any(run["skipped"])
        else:
            assert run["skipped"][0] and not all(run["skipped"])  # the test has teeth


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_reducing_in_fp32_rounds_once(results, world_size, dtype):
    """reduce_dtype=fp32 sums in fp32 and, the shards being fp32 (FSDP2), never rounds
    the sum to 16 bits: on one rank there is nothing to add and the two are equal;
    with more, the 16-bit reduction rounds each sum and the fp32 one does not, so they
    differ (within the data-parallel bound of each other when they skipped the same
    steps). In fp16 a sum that
    overflows 65504 in 16 bits need not in fp32: it skips at most the steps the fp16
    reduction skips."""
    for rank_result in results(world_size):
        low = rank_result["mixed"][(dtype, "fsdp")]
        run = rank_result["mixed"][(dtype, "fsdp_reduce_fp32")]
        single = rank_result["mixed"][(dtype, "single")]
        assert all(s <= t for s, t in zip(run["skipped"], low["skipped"]))
        if world_size == 1:
            assert _same(run["params"], low["params"]) and run["skipped"] == low["skipped"]
        else:
            assert not _same(run["params"], low["params"])  # the 16-bit rounding is gone
            if run["skipped"] == low["skipped"]:  # else one of them took a step more
                assert _mean_difference(run["params"], low["params"]) < LR / 10
        if dtype == "torch.bfloat16":
            assert _mean_difference(run["params"], single["params"]) < LR / 10


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_fp16_overflow_skips_the_same_steps_on_every_rank(results, world_size):
    per_rank = results(world_size)
    for dtype_run in [("torch.float16", "fsdp"), ("torch.float16", "fsdp_reduce_fp32")]:
        skipped = [r["mixed"][dtype_run]["skipped"] for r in per_rank]
        assert all(s == skipped[0] for s in skipped) and any(skipped[0]), dtype_run
        for r in per_rank[1:]:
            params, first = r["mixed"][dtype_run]["params"], per_rank[0]["mixed"][dtype_run]
            assert all(torch.equal(params[k], first["params"][k]) for k in params)
    # The inf sits in rank 0's shard only: the other ranks' own gradients look finite,
    # yet every rank skips the step, keeps its weights and halves the scale.
    overflow = [r["overflow"] for r in per_rank]
    assert [o["finite_here"] for o in overflow] == [False] + [True] * (world_size - 1)
    assert all(not o["stepped"] and o["unchanged"] and o["scale"] == 2.0**7 for o in overflow)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_mixed_precision_memory_and_traffic_match_the_calculator(results, world_size):
    """Per rank: the fp32_adam recipe at ZeRO stage 3, (4 + 4 + 8) Ψ / K bytes at the
    padded count (fp32 shard, the master, and its fp32 gradient; Adam m and v): the
    same 16 Ψ / K as the paper's mixed_adam split (2 + 2 + 12), the master counted as
    a parameter instead of optimizer state. Bytes sent per step: two 16-bit
    all-gathers and a reduce-scatter in the reduce dtype."""
    for rank_result in results(world_size):
        for dtype in ("torch.bfloat16", "torch.float16"):
            for name, grad_bytes in (("fsdp", 2), ("fsdp_reduce_fp32", 4)):
                run = rank_result["mixed"][(dtype, name)]
                padded = model_state_bytes(
                    run["padded"], recipe="fp32_adam", zero_stage=3, dp=world_size
                )
                exact = model_state_bytes(
                    run["n_params"], recipe="fp32_adam", zero_stage=3, dp=world_size
                )
                paper = model_state_bytes(
                    run["padded"], recipe="mixed_adam", zero_stage=3, dp=world_size
                )
                assert padded.total == paper.total  # 16 bytes per parameter either way
                measured = run["memory"]
                assert (measured.parameters, measured.gradients, measured.optimizer_states) == (
                    padded.parameters,
                    padded.gradients,
                    padded.optimizer_states,
                ), (dtype, name, measured, padded)
                slack = (run["padded"] - run["n_params"]) * get_recipe("fp32_adam").bytes_per_param
                assert 0 <= measured.total - exact.total <= slack
                expected = data_parallel_comm(
                    run["padded"],
                    dp=world_size,
                    zero_stage=3,
                    bytes_per_param=2,
                    bytes_per_grad=grad_bytes,
                ).total
                for sent in run["sent"]:
                    sharded = sent.get("ring_all_gather", 0) + sent.get("ring_reduce_scatter", 0)
                    assert sharded == expected, (dtype, name, sent, expected)
                    # fp16 only: the one-element overflow flag's all-reduce (any_rank)
                    flag = sent.get("ring_all_reduce", 0)
                    assert (flag > 0) == (dtype == "torch.float16" and world_size > 1)
                    assert flag <= 2 * 4 * world_size


def test_a_policy_takes_only_floating_dtypes():
    with pytest.raises(ValueError, match="param_dtype must be None or one of"):
        MixedPrecisionPolicy(param_dtype=torch.int8)
    with pytest.raises(ValueError, match="reduce_dtype"):
        MixedPrecisionPolicy(reduce_dtype="fp32")


# ---------------------------------------------- gradients by name, clip ----
def _whole(per_rank, name, pieces):
    """A parameter's flattened gradient from the ranks' pieces, checking they tile it."""
    stop = 0
    for rank_result in per_rank:
        (start, end), grad = pieces(rank_result)[name]
        assert start == stop and end - start == grad.numel()
        stop = end
    return torch.cat([pieces(r)[name][1] for r in per_rank])


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gradients_by_name_after_backward(results, world_size):
    """Every parameter name (the tied embedding once) has its gradient shard; the
    ranks' pieces tile each flattened gradient and equal single-process gradients
    (bit for bit on one and two ranks). The wrapped module's .grad stays None until
    gather_gradients() fills it with the full gradient, by name, on every rank."""
    per_rank = results(world_size)
    reference = per_rank[0]["named"]["reference"]["grads"]
    for rank_result in per_rank:
        assert rank_result["named"]["module_grads"] == [None] * len(reference)
        assert rank_result["named"]["grads"].keys() == reference.keys()
        assert rank_result["named"]["full_grads"].keys() == reference.keys()
    for name, grad in reference.items():
        whole = _whole(per_rank, name, lambda r: r["named"]["grads"])
        if world_size <= 2:
            assert torch.equal(whole, grad), name
        torch.testing.assert_close(whole, grad, rtol=1e-5, atol=1e-7)
        for rank_result in per_rank:  # .grad after gather_gradients: the same full gradient
            assert torch.equal(rank_result["named"]["full_grads"][name], whole), name


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_clipping_the_full_gradients_by_hand_reaches_the_shards(results, world_size):
    """torch.nn.utils.clip_grad_norm_ on the wrapped module's .grad after gather_gradients()
    (every rank sees the same full gradients, so the same norm) scales what the optimizer
    steps exactly as FSDP's own clip_grad_norm_ does. The next forward drops the full
    gradients again and keeps this rank's clipped part."""
    per_rank = results(world_size)
    _, reference = per_rank[0]["named"]["reference"][2.0]
    for name, grad in reference.items():
        by_hand = _whole(per_rank, name, lambda r: r["named"]["clipped_by_hand"])
        kept = _whole(per_rank, name, lambda r: r["named"]["shard_grads_after_forward"])
        ours = _whole(per_rank, name, lambda r: r["named"]["clipped"][2.0][1])
        torch.testing.assert_close(by_hand, grad, rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(by_hand, ours, rtol=1e-6, atol=1e-9)
        assert torch.equal(kept, by_hand), name
    for rank_result in per_rank:
        assert rank_result["named"]["grads_after_forward"] == [None] * len(reference)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clipping_across_shards_equals_clip_grad_norm(results, world_size, norm_type):
    per_rank = results(world_size)
    total, reference = per_rank[0]["named"]["reference"][norm_type]
    assert total > 2 * CLIP  # clipping really scales the gradients
    for rank_result in per_rank:
        measured = rank_result["named"]["clipped"][norm_type][0]
        assert measured == per_rank[0]["named"]["clipped"][norm_type][0]  # one factor
        assert measured == pytest.approx(total, rel=1e-6)
    for name, grad in reference.items():
        whole = _whole(per_rank, name, lambda r: r["named"]["clipped"][norm_type][1])
        torch.testing.assert_close(whole, grad, rtol=1e-5, atol=1e-8)


@pytest.mark.slow
def test_bad_clipping_and_policy_arguments_name_the_value(results):
    errors = results(2)[0]["named"]["errors"]
    assert "max_norm must be a positive finite number, got -1.0" in errors[0]
    assert "norm_type must be a positive number or inf, got 0" in errors[1]
    assert "got '1'" in errors[2]
    assert "no trainable parameter 'no.such.weight'" in errors[3]
    assert "mixed_precision must be a MixedPrecisionPolicy or None, got 'bf16'" in errors[4]


# ------------------------------------------------- fidelity to FSDP2 ----
def _max_gap(a: dict, b: dict) -> float:
    return _max_difference(a, b)


@pytest.mark.slow
def test_fp16_masters_start_from_the_weights_fsdp_was_given(results):
    """Issue 28 (1): the fp32 masters are the original fp32 weights, bit for bit (FSDP2
    keeps them as its sharded parameters). Casting first and taking the masters from the
    float16 copy moved the weights of size 2 to 4 by up to half an ulp, 2^-10 = 9.8e-4."""
    for rank_result in results(2):
        fidelity = rank_result["fidelity"]
        start = fidelity["fp16"][0]
        assert all(v.dtype == torch.float32 for v in start.values())
        assert _same(start, fidelity["original"]), _max_gap(start, fidelity["original"])
        rounded = {n: v.half().float() for n, v in fidelity["original"].items()}
        assert _max_gap(rounded, fidelity["original"]) > FP16_ULP_AT_2 / 4  # has teeth


@pytest.mark.slow
def test_fp32_and_fp16_fsdp_track_a_single_process_fp32_run(results):
    """2 ranks, SGD, the first layer's weights of size 2 to 4. fp32 FSDP equals the
    single-process run (the two ranks' halves as two micro-batches) bit for bit after
    every step. fp16 FSDP starts equal and then differs only by float16 compute: after
    each step, by less than 2^-8 of how far the weights have moved (a few float16
    roundings of the update), far below the 9.8e-4 of a master made from float16."""
    per_rank = results(2)
    reference = per_rank[0]["fidelity"]["reference"]
    moved = [_max_gap(state, reference[0]) for state in reference]
    assert moved[-1] > 10 * FP16_ULP_AT_2  # the steps move the weights by many ulps
    for rank_result in per_rank:
        fidelity = rank_result["fidelity"]
        for step, want in enumerate(reference):
            assert _same(fidelity["fp32"][step], want), step
            gap = _max_gap(fidelity["fp16"][step], want)
            assert gap <= 2.0**-8 * moved[step], (step, gap, moved[step])
            assert gap < FP16_ULP_AT_2 / 4, (step, gap)


@pytest.mark.slow
def test_a_torch_optimizer_steps_the_fp32_shards_as_fsdp2_does(results):
    """Issue 39: torch.optim.SGD(fsdp.parameters()) on a model wrapped with
    param_dtype=float16 steps fp32 shards (FSDP2's sharded parameters are the masters),
    so it trains (the fp16 fidelity run above uses exactly that optimizer); full
    gradients cannot go into the float16 weights' .grad, and gather_gradients says what
    to call instead."""
    for rank_result in results(2):
        fidelity = rank_result["fidelity"]
        assert fidelity["plain_step"] == "stepped" and not fidelity["plain_unchanged"]
        assert fidelity["plain_dtypes"] == {"torch.float32"}
        message = fidelity["gather_gradients"]
        assert "torch.float32 shards" in message and "full_gradients()" in message, message
