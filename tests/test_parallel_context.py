"""Context parallelism on 1, 2 and 4 gloo ranks against dense causal attention:
ring attention and the K/V all-gather (Llama 3).

Each rank holds its tokens of Q, K and V (contiguous or zig-zag split); the
output and the gradients of Q, K and V must equal dense causal attention's on
those tokens, with N-1 messages per pass (forward and backward), and the
work each rank computes shows the zig-zag split's balance. The all-gather
sends the bytes ``calc.comm.context_parallel_gather_comm`` counts (the ring's),
and each method holds the K/V ``calc.comm.context_parallel_kv_bytes`` says.
One launch per group size runs every case (``gpt_blocks.worker``, shared with
test_parallel_ulysses.py).
"""

from __future__ import annotations

import pytest
import torch
from gpt_blocks import ContextCase, assert_attention_equals_dense, assert_block_equals_dense
from gpt_blocks import results as run_blocks

import distlab
from distlab.calc.comm import context_parallel_gather_comm, context_parallel_kv_bytes

B, A, S, D = 2, 3, 16, 8
CASE = ContextCase(B, A, S, D, seed=5, block_seed=0, block_data_seed=6)
SPLITS = ("contiguous", "zigzag")
ATTENTION = tuple((method, split) for method in ("ring", "gather") for split in SPLITS)
BLOCKS = (("ring", "zigzag"), ("gather", "contiguous"))


def results(cp: int):
    return run_blocks(CASE, cp, ATTENTION, BLOCKS)


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
@pytest.mark.parametrize("method", ["ring", "gather"])
def test_context_parallel_attention_equals_dense_causal_attention(cp, split, method):
    assert_attention_equals_dense(CASE, results(cp), method, split)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_gather_sends_the_rings_bytes_and_holds_every_block(cp):
    shape = {"seq_len": S // cp, "micro_batch": B, "hidden": A * D, "bytes_per_element": 4}
    volume = context_parallel_gather_comm(**shape, layers=1, cp=cp)
    per_phase = {part.what.split()[0]: part.bytes_sent for part in volume.parts}
    for res in results(cp):
        for split in SPLITS:
            gather, ring = res["attention"]["gather", split], res["attention"]["ring", split]
            assert gather["bytes"] == per_phase == ring["bytes"]
            assert gather["messages"] == ring["messages"]  # N-1 ring steps each way
            assert gather["held"] == context_parallel_kv_bytes("all_gather", **shape, cp=cp)
            assert ring["held"] == context_parallel_kv_bytes("ring", **shape, cp=cp)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_n_minus_one_messages_per_pass(cp):
    block_bytes = 2 * B * A * (S // cp) * D * 4  # K and V of this rank's tokens, fp32
    for res in results(cp):
        for split in SPLITS:
            got = res["attention"]["ring", split]
            expected = {"forward": cp - 1, "backward": cp - 1} if cp > 1 else {}
            assert got["messages"] == expected
            assert got["bytes"] == {phase: n * block_bytes for phase, n in expected.items()}


@pytest.mark.parametrize("cp", [2, 4])
def test_zigzag_balances_the_causal_work(cp):
    c = S // cp  # tokens per rank
    contiguous = [res["attention"]["ring", "contiguous"]["work"] for res in results(cp)]
    zigzag = [res["attention"]["ring", "zigzag"]["work"] for res in results(cp)]
    per_head = B * A
    # contiguous: rank r computes r+1 blocks of c x c scores; zig-zag: 2N+1 blocks of (c/2)^2
    assert contiguous == [per_head * (r + 1) * c * c for r in range(cp)]
    assert zigzag == [per_head * (2 * cp + 1) * (c // 2) ** 2] * cp


def _bad(rank, world_size):
    from distlab.parallel.context.ring import Ring, ring_attention

    try:
        q = torch.zeros(1, 1, 5, 4)
        ring_attention(q, q, q, Ring(split="zigzag"), 10)
    except ValueError as error:
        return str(error)


def test_a_sequence_the_split_cannot_cut_is_refused_on_every_rank():
    errors = distlab.run(_bad, 2, timeout=60, show_output=False)
    assert all("seq_len=10 must be divisible by 4 for the zigzag split" in e for e in errors)


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize(("method", "split"), BLOCKS)
def test_context_parallel_block_equals_dense_block(cp, method, split):
    assert_block_equals_dense(CASE, results(cp), method, split)


def test_ring_messages_reach_the_comm_trace_as_cp_sends():
    block_bytes = 2 * B * A * (S // 2) * D * 4
    for res in results(2):
        calls = res["attention"]["ring", "contiguous"]["calls"]
        assert calls == [("cp", "send", block_bytes), ("cp", "recv", 0)] * 2
