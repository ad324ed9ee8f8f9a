"""DeepSpeed-Ulysses (all-to-all sequence parallelism) on 1, 2 and 4 gloo ranks against dense attention.

Each rank holds its tokens of Q, K and V (contiguous or zig-zag split); the
output and the gradients of Q, K and V must equal dense causal attention's on
those tokens, a GPT block with Ulysses attention must equal the dense block
(output, input gradient, every weight gradient), the bytes each rank sends
must equal ``calc.comm.ulysses_comm`` and the wire count, and a head count
the group cannot divide is refused by name. One launch per group size runs every
case (``gpt_blocks.worker``, shared with test_parallel_context.py).
"""

from __future__ import annotations

import pytest
import torch
from gpt_blocks import ContextCase, assert_attention_equals_dense, assert_block_equals_dense
from gpt_blocks import results as run_blocks

import distlab
from distlab.calc.comm import context_parallel_kv_bytes, ulysses_comm
from distlab.models import GPTBlock

B, A, S, D = 2, 4, 16, 8
CASE = ContextCase(B, A, S, D, seed=7, block_seed=1, block_data_seed=8)
ATTENTION = (("ulysses", "contiguous"), ("ulysses", "zigzag"))
BLOCKS = (("ulysses", "zigzag"),)


def results(n: int):
    return run_blocks(CASE, n, ATTENTION, BLOCKS)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
def test_ulysses_attention_equals_dense_causal_attention(n, split):
    assert_attention_equals_dense(CASE, results(n), "ulysses", split)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_four_all_to_alls_each_way_send_what_calc_counts(n):
    volume = ulysses_comm(
        seq_len=S // n, micro_batch=B, hidden=A * D, layers=1, cp=n, bytes_per_element=4
    )
    per_phase = {part.what.split()[0]: part.bytes_sent for part in volume.parts}
    for res in results(n):
        got = res["attention"]["ulysses", "zigzag"]
        assert got["messages"] == ({"forward": 4, "backward": 4} if n > 1 else {})
        assert got["bytes"] == {phase: b for phase, b in per_phase.items()}
        assert got["wire"] == volume.total  # what distlab's all-to-all put on the wire
        traced = sum(wire for _, collective, wire in got["calls"] if collective == "all_to_all")
        assert traced == volume.total  # and what the comm trace saw
        assert got["held"] == context_parallel_kv_bytes(
            "ulysses", seq_len=S // n, micro_batch=B, hidden=A * D, cp=n, bytes_per_element=4
        )


@pytest.mark.parametrize("n", [1, 2, 4])
def test_ulysses_block_equals_dense_block(n):
    assert_block_equals_dense(CASE, results(n), "ulysses", "zigzag")


def _bad_heads(rank, world_size):
    from distlab.parallel.context.ring import ContextParallelBlock
    from distlab.parallel.context.ulysses import Ulysses, ulysses_attention

    errors = []
    cp = Ulysses()
    try:
        q = torch.zeros(1, 3, 4, 2)  # 3 heads, 4 tokens per rank
        ulysses_attention(q, q, q, cp, 4 * world_size)
    except ValueError as error:
        errors.append(str(error))
    try:
        ContextParallelBlock(GPTBlock(6, 3, max_seq_len=8), cp, seq_len=8)
    except ValueError as error:
        errors.append(str(error))
    return errors


def test_heads_the_group_cannot_divide_are_refused_on_every_rank():
    for errors in distlab.run(_bad_heads, 2, timeout=60, show_output=False):
        assert len(errors) == 2
        assert all("heads=3 is not divisible by the Ulysses group size N=2" in e for e in errors)
