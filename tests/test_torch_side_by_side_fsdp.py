"""distlab's FSDP next to PyTorch's FSDP2 (``fully_shard``), and DeepSpeed's memory
estimator next to ``distlab.calc.memory`` (notebook 06, "The same with torch").

The FSDP run: one small GPT (tied embedding), the same batches, SGD with
momentum, 2 gloo ranks, one unit per block plus the root, in fp32. distlab's
FSDP shards a flat buffer per unit, FSDP2 each parameter along dimension 0, but
both compute with the same full weights, average the same two gradients (a + b,
halved: exact) and update each element the same way, so losses, per-parameter
gradients (by name, full: ``gather_gradients()`` and ``DTensor.full_tensor()``)
and weights are equal bit for bit. In fp16 both keep fp32 shards (the masters) and
cast them for each all-gather, and a plain torch SGD steps them; the first loss is
equal and the float16 gradient reduction rounds differently: one float16 rounding
apart.
"""

from __future__ import annotations

import json

import pytest
import torch

import distlab
from distlab.calc import memory

STEPS = 3
LR = 0.1


def _side_by_side(rank, world_size, param_dtype):
    """Per step: each rank's loss and every parameter's full gradient, by name, for
    distlab's FSDP and FSDP2; then the full weights after the last step."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy as TorchPolicy
    from torch.distributed.fsdp import fully_shard

    from distlab.models import GPT, GPTBlock, GPTConfig, gpt_batch
    from distlab.parallel import FSDP, MixedPrecisionPolicy, shard_batch
    from distlab.parallel.checkpoint.data_parallel import full_state
    from distlab.parallel.data.training import lm_loss

    torch.set_num_threads(1)
    config = GPTConfig(layers=2)
    sgd = {"lr": LR, "momentum": 0.9}
    policy = MixedPrecisionPolicy(param_dtype=param_dtype)
    ours = FSDP(GPT(config, seed=0), wrap=(GPTBlock,), mixed_precision=policy)
    our_optimizer = torch.optim.SGD(ours.parameters(), **sgd)  # fp32 shards either way
    theirs = GPT(config, seed=0)
    mesh = init_device_mesh("cpu", (world_size,))
    torch_policy = TorchPolicy(param_dtype=param_dtype)  # fp32 shards, 16-bit all-gathers
    for block in theirs.blocks:
        fully_shard(block, mesh=mesh, mp_policy=torch_policy)
    fully_shard(theirs, mesh=mesh, mp_policy=torch_policy)
    runs = {
        "distlab": (ours, our_optimizer),
        "fsdp2": (theirs, torch.optim.SGD(theirs.parameters(), **sgd)),
    }
    steps = []
    for step in range(STEPS):
        batch = shard_batch(gpt_batch(8, config, seed=step), rank, world_size)
        record = {}
        for name, (model, optimizer) in runs.items():
            optimizer.zero_grad()
            loss = lm_loss(model, batch)
            loss.backward()
            if name == "distlab":
                grads = model.full_gradients()
            else:
                grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            optimizer.step()
            record[name] = (loss.item(), grads)
        steps.append(record)
    weights = {
        "distlab": full_state(*runs["distlab"])["params"],
        "fsdp2": {n: p.full_tensor() for n, p in theirs.named_parameters()},
    }
    return steps, weights


@pytest.fixture(scope="module", params=[None, torch.float16], ids=["fp32", "fp16"])
def side_by_side(request):
    return distlab.run(_side_by_side, 2, args=(request.param,), timeout=300), request.param


def _max_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).detach().abs().max()) for k in a)


FP16_ROUNDING = 2.0**-10  # float16 keeps 10 bits after the leading one
FP16_SMALLEST = 2.0**-24  # its smallest subnormal


def test_fp32_losses_gradients_by_name_and_weights_equal_fsdp2_bit_for_bit(side_by_side):
    steps_and_weights, param_dtype = side_by_side
    if param_dtype is not None:
        pytest.skip("fp32 only; fp16 below")
    for steps, weights in steps_and_weights:
        for step, record in enumerate(steps):
            (loss, grads), (want_loss, want_grads) = record["distlab"], record["fsdp2"]
            assert loss == want_loss, step
            assert grads.keys() == want_grads.keys()
            for name, grad in grads.items():
                assert torch.equal(grad, want_grads[name]), (step, name)
        assert _max_gap(weights["distlab"], weights["fsdp2"]) == 0.0


def test_fp16_equals_fsdp2_up_to_the_rounding_of_the_gradient_reduction(side_by_side):
    """float16 compute from fp32 shards in both, started from the same fp32 weights, a
    plain SGD on the shards: the first forward and loss are equal bit for bit; the
    float16 gradient reduce-scatter rounds differently in the two libraries, so the
    gradients differ by at most one float16 rounding (2^-10 relative, or a subnormal
    step), and the weights after 3 steps by less than 1e-4 (measured 1.5e-5)."""
    steps_and_weights, param_dtype = side_by_side
    if param_dtype is None:
        pytest.skip("fp16 only; fp32 above")
    for steps, weights in steps_and_weights:
        (loss, grads), (want_loss, want_grads) = steps[0]["distlab"], steps[0]["fsdp2"]
        assert loss == want_loss
        assert grads.keys() == want_grads.keys()
        for name, grad in grads.items():
            want = want_grads[name]
            bound = FP16_ROUNDING * want.abs() + FP16_SMALLEST
            assert ((grad.float() - want).abs() <= bound).all(), name
        gap = _max_gap(weights["distlab"], weights["fsdp2"])
        assert 0 < gap < 1e-4, gap


# ------------------------------------------------- DeepSpeed's estimator ----
@pytest.mark.parametrize("dp", [1, 8, 64])
def test_deepspeed_estimate_is_the_paper_count_plus_an_fp32_gradient_partition(dp):
    """DeepSpeed's ZeRO-2: 4Ψ + 16Ψ/N, the paper's stage 1 plus 4Ψ/N; its ZeRO-3: 18Ψ/N
    plus 4 bytes per parameter of the largest layer, the paper's stage 3 plus 4Ψ/N less
    the paper's 2Ψ/N of 16-bit gradient shard."""
    psi, layer = 7.5e9, 2e8
    two = memory.deepspeed_estimate(psi, zero_stage=2, dp=dp)
    paper_1 = memory.model_state_bytes(psi, recipe="mixed_adam", zero_stage=1, dp=dp)
    assert two.total == pytest.approx(4 * psi + 16 * psi / dp)
    assert two.total == pytest.approx(paper_1.total + two.fp32_gradients)
    three = memory.deepspeed_estimate(psi, zero_stage=3, dp=dp, largest_layer_params=layer)
    paper_3 = memory.model_state_bytes(psi, recipe="mixed_adam", zero_stage=3, dp=dp)
    assert three.total == pytest.approx(4 * layer + 18 * psi / dp)
    extra = three.fp32_gradients - three.paper_gradients_left_out + 4 * layer
    assert three.total == pytest.approx(paper_3.total + extra)


def test_deepspeed_prints_gib_and_calls_them_gb():
    estimate = memory.deepspeed_estimate(7.5e9, zero_stage=3, dp=64)
    assert estimate.total == 18 * 7.5e9 / 64
    assert estimate.printed_gb == estimate.total / 2**30 == pytest.approx(1.9645, abs=1e-4)
    assert estimate.total / 1e9 == pytest.approx(2.109, abs=1e-3)  # in the paper's GB


def test_deepspeed_estimate_refuses_bad_values():
    with pytest.raises(ValueError, match="zero_stage 1"):
        memory.deepspeed_estimate(1e9, zero_stage=1)
    with pytest.raises(ValueError, match="largest_layer_params"):
        memory.deepspeed_estimate(1e9, zero_stage=3, largest_layer_params=-5)


def test_distlab_memory_shows_the_deepspeed_convention_by_name(capsys):
    from distlab.commands.calc import standalone_parser

    argv = ["memory", "--params", "7.5e9", "--dp", "64", "--convention", "deepspeed", "--json"]
    args = standalone_parser().parse_args(argv)
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["convention"] == "deepspeed"
    rows = {r["zero_stage"]: r for r in out["rows"]}
    assert rows.keys() == {2, 3}
    assert rows[3]["total"] == memory.deepspeed_estimate(7.5e9, zero_stage=3, dp=64).total
    assert rows[2]["printed_gb"] == pytest.approx((4 + 16 / 64) * 7.5e9 / 2**30)
    args = standalone_parser().parse_args(argv[:-1])  # the table names both units
    assert args.func(args) == 0
    table = capsys.readouterr().out
    assert "DeepSpeed prints 'GB'" in table and "1.96" in table and "2.11" in table
