"""Data loading and checkpoint storage (distlab.calc.storage), and the planner's layout lookups."""

from __future__ import annotations

import pytest

from distlab.calc import flops, storage
from distlab.calc.memory import get_recipe
from distlab.calc.planner import peak_memory, plan
from distlab.core.layout import Layout
from distlab.sim.topology import preset


@pytest.mark.parametrize(
    ("vocab", "width"), [(32_000, 2), (50_257, 2), (65_499, 2), (65_500, 4), (128_256, 4)]
)
def test_token_ids_take_two_bytes_below_65500(vocab, width):
    assert storage.token_id_bytes(vocab) == width


def test_data_loading_rate():
    # 1024 sequences of 4096 tokens every 16 s on 32 nodes, a 2-byte vocabulary
    rate = storage.data_loading(
        global_batch=1024, seq_len=4096, step_s=16.0, vocab=32_000, nodes=32, tokens=2e12
    )
    assert rate.tokens_per_s == 1024 * 4096 / 16
    assert rate.bytes_per_s == 2 * 1024 * 4096 / 16
    assert rate.bytes_per_s_per_node == rate.bytes_per_s / 32
    assert rate.dataset_bytes == 4e12
    assert (
        storage.data_loading(global_batch=1, seq_len=8, step_s=1, vocab=128_256).bytes_per_s == 32
    )


def test_checkpoint_bytes_follow_the_recipe():
    # mixed-precision Adam: 12 bytes/param of fp32 master + m + v, plus 2 of bf16 weights
    full = storage.checkpoint_cost(70e9, writers=1, write_bytes_per_s=1e9)
    assert (full.weights_bytes, full.optimizer_bytes) == (140e9, 840e9)
    minimal = storage.checkpoint_cost(70e9, writers=1, write_bytes_per_s=1e9, model_weights=False)
    assert minimal.total == 840e9
    # without a master copy the weights must be saved whatever model_weights says
    fp32 = storage.checkpoint_cost(
        1e9, writers=1, write_bytes_per_s=1e9, recipe="fp32_adam", model_weights=False
    )
    assert fp32.total == 12e9
    assert get_recipe("mixed_adam").master_bytes == 4 and get_recipe("bf16_adam").master_bytes == 0


def test_checkpoint_write_time_and_storage():
    cost = storage.checkpoint_cost(70e9, writers=256, write_bytes_per_s=1e9, keep=3)
    assert cost.write_s == pytest.approx(980e9 / 256e9)
    assert cost.stored_bytes == 3 * 980e9
    capped = storage.checkpoint_cost(
        70e9, writers=256, write_bytes_per_s=1e9, storage_bytes_per_s=100e9
    )
    assert capped.write_s == pytest.approx(9.8)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"writers": 0},
        {"write_bytes_per_s": -1.0},
        {"keep": 0},
        {"recipe": "adamw"},
        {"storage_bytes_per_s": 0},
    ],
)
def test_checkpoint_bad_values(kwargs):
    args = {"writers": 8, "write_bytes_per_s": 1e9, **kwargs}
    with pytest.raises((ValueError, TypeError)):
        storage.checkpoint_cost(7e9, **args)


def test_run_seconds_counts_whole_steps():
    assert flops.run_seconds(10, tokens_per_step=4, step_s=2.0) == 6.0  # 3 steps
    with pytest.raises(ValueError, match="step_s"):
        flops.run_seconds(10, tokens_per_step=4, step_s=0)


def test_estimate_for_finds_fitting_layouts_only():
    result = plan("7B", preset("dgx-h100", nodes=2), global_batch=32)
    best = result.best
    assert result.estimate_for(best.layout) is best
    assert peak_memory("7B", best.layout).total == best.memory.total
    off_grid = Layout(tp=3, dp=5, sequence_parallel=True)
    assert result.estimate_for(off_grid) is None
    too_big = Layout(dp=16, micro_batch=2)
    assert peak_memory("7B", too_big).total > 72e9 and result.estimate_for(too_big) is None
    if best.layout.tp > 1:  # the planner enumerates sequence parallelism on whenever tp > 1
        assert result.estimate_for(best.layout.with_(sequence_parallel=False)) is None
    with pytest.raises(TypeError, match="Layout"):
        result.estimate_for((1, 1, 16))
    with pytest.raises(ValueError, match="cp=2"):
        peak_memory("7B", Layout(cp=2, dp=8))
