"""Expert capacity and the all-to-all volume of expert parallelism, against hand counts.

The equality with bytes measured on real ranks is in tests/test_parallel_moe.py.
"""

from __future__ import annotations

import pytest

from distlab.calc.moe import expert_capacity, moe_all_to_all_comm
from distlab.calc.volume import CommVolume


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "factor", "capacity"),
    [
        (16, 4, 1, 1.25, 5),  # Switch: 16/4 x 1.25 = 5 exactly
        (16, 4, 2, 1.0, 8),  # top-2 doubles the assignments
        (7, 4, 1, 1.0, 2),  # 1.75 rounds up
        (10, 1, 1, 1.1, 11),  # 11.000000000000002 in floats: still 11
        (4096, 64, 1, 2.0, 128),
    ],
)
def test_expert_capacity(tokens, experts, top_k, factor, capacity):
    got = expert_capacity(tokens, experts, top_k=top_k, capacity_factor=factor)
    assert got == capacity


def test_moe_volume_by_hand():
    # C = ceil(1.0 * 1024 * 2 / 8) = 256; buffer = 8 x 256 x 512 x 2 bytes = 2,097,152
    volume = moe_all_to_all_comm(
        tokens=1024, hidden=512, num_experts=8, ep=4, top_k=2, capacity_factor=1.0, moe_layers=3
    )
    assert isinstance(volume, CommVolume)
    assert len(volume.parts) == 4
    assert volume.total == 4 * 3 * 3 / 4 * 2_097_152  # 4 all-to-alls x 3 layers x (ep-1)/ep
    assert volume.messages == 4 * 3 * 3  # ep - 1 messages per all-to-all


def test_moe_micro_batches_repeat_every_all_to_all():
    # each micro-batch routes its own tokens into its own padded buffer: same payload, m x calls
    shape = {"tokens": 100, "hidden": 64, "num_experts": 8, "ep": 4, "moe_layers": 2}
    one = moe_all_to_all_comm(**shape)
    three = moe_all_to_all_comm(**shape, micro_batches=3)
    assert [p.payload_bytes for p in three.parts] == [p.payload_bytes for p in one.parts]
    assert [p.count for p in three.parts] == [3 * 2] * 4
    assert three.total == 3 * one.total


def test_moe_volume_without_expert_parallelism_is_zero():
    assert moe_all_to_all_comm(tokens=64, hidden=32, num_experts=4, ep=1).total == 0


def test_moe_bad_input():
    with pytest.raises(ValueError, match="num_experts=6 is not divisible by ep=4"):
        moe_all_to_all_comm(tokens=64, hidden=32, num_experts=6, ep=4)
    with pytest.raises(ValueError, match="micro_batches"):
        moe_all_to_all_comm(tokens=64, hidden=32, num_experts=4, ep=4, micro_batches=0)
    with pytest.raises(ValueError, match="top_k=3 must be <= num_experts=2"):
        expert_capacity(64, 2, top_k=3)
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(64, 2, capacity_factor=-1.0)
    with pytest.raises(TypeError, match="tokens"):
        expert_capacity("64", 2)
