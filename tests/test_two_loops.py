"""The two training loops take the same steps where both apply.

``distlab.parallel.compose.train`` (the GPT under any layout) and
``distlab.parallel.data.training.train_step`` (any module under one data-parallel
method) are two loops over the same parts; ``distlab.parallel.compose`` says why both
stay. On the GPT under pure data parallelism they must agree: the same parameters after
the same steps (to fp32 rounding), for DDP, ZeRO-1 and ZeRO-2, with SGD and with Adam.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.core.layout import Layout
from distlab.models import GPT, GPTConfig, gpt_batch
from distlab.parallel.compose import OPTIMIZERS, train
from distlab.parallel.data import training

CONFIG = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=2)
STEPS, LR = 3, 0.05
METHOD = {0: "bucketed_ddp", 1: "zero1", 2: "zero2"}
#: Each rank sees the same sequences in both loops, but the loss and the gradient average
#: are summed in another order (the pipeline executor's loss, DDP's buckets against
#: ZeRO's flat groups), so the parameters agree to fp32 rounding, not bit for bit (SGD:
#: measured 3.7e-9 at most, compared element by element). Adam's first steps move each
#: element by about lr * g / |g|, so an element whose gradient is near Adam's eps (1e-8)
#: turns that rounding into a share of one step that depends on the CPU's kernels: the
#: largest element measured 2.4e-4 lr on one machine and 1.2e-3 lr on another. Adam is
#: therefore compared tensor by tensor, by the size of the difference between the two
#: loops' updates against the size of the update: measured 1.0e-4 at most (ln_f.bias; the
#: embedding 1.2e-5), bounded by 1e-3, while a loop whose lr were 1 % off gives 1e-2 and
#: one element of a 32-element bias a whole step off about 0.2.
SGD_TOLERANCE = {"rtol": 1e-5, "atol": 1e-7}
ADAM_UPDATE_TOLERANCE = 1e-3


def _both_loops(rank, world_size, zero_stage, optimizer):
    tokens, targets = gpt_batch(4, CONFIG, seed=1)
    run = train(
        GPT(CONFIG, seed=0),
        Layout(dp=world_size, zero_stage=zero_stage),
        tokens,
        targets,
        steps=STEPS,
        lr=LR,
        optimizer=optimizer,
    )
    torch_class, kwargs, _ = OPTIMIZERS[optimizer]
    model = GPT(CONFIG, seed=0)
    trainer = training.build(
        METHOD[zero_stage], model, optimizer_class=torch_class, lr=LR, **kwargs
    )
    # train_step's ranks read DistributedSampler's strided samples (r, r + n, ...) and
    # train's replicas contiguous ones: interleave the batch so both give each rank the
    # same sequences in the same order
    b = tokens.shape[0]
    order = torch.arange(b).reshape(world_size, b // world_size).T.reshape(-1)
    for _ in range(STEPS):
        training.train_step(trainer, (tokens[order], targets[order]), training.lm_loss)
    return run.shards, {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("zero_stage", "optimizer"),
    [
        (1, "adam"),  # the fast tier's case; the rest by measured cost (about 3 s each)
        *(
            pytest.param(stage, name, marks=pytest.mark.slow)
            for stage, name in [(0, "sgd"), (0, "adam"), (1, "sgd"), (2, "sgd"), (2, "adam")]
        ),
    ],
)
def test_compose_train_and_train_step_take_the_same_steps(zero_stage, optimizer):
    initial = GPT(CONFIG, seed=0).state_dict()
    for composed, plain in distlab.run(_both_loops, 2, args=(zero_stage, optimizer)):
        assert composed.keys() == plain.keys()
        moved = max((plain[n] - initial[n]).abs().max().item() for n in plain)
        assert moved > 1e-3, "the parameters did not move: equal, but trained by neither loop"
        for name in plain:
            if optimizer == "adam" and name.endswith("attn.k.bias"):
                # softmax ignores a shift of every score by the same amount, so the key
                # bias's gradient is zero but for rounding, and Adam normalises that
                # noise into steps of about lr in either direction: no loop agrees there
                assert (composed[name] - initial[name]).abs().max() <= STEPS * LR * 1.01
                continue
            if optimizer == "sgd":
                torch.testing.assert_close(composed[name], plain[name], **SGD_TOLERANCE)
                continue
            update = plain[name] - initial[name]
            off = (composed[name] - plain[name]).norm() / update.norm()
            assert off <= ADAM_UPDATE_TOLERANCE, (
                f"{name}: the loops' updates differ by {off:.2e} of the update's size "
                f"(bound {ADAM_UPDATE_TOLERANCE:g})"
            )
