"""Context parallelism on 1, 2 and 4 gloo ranks against dense causal attention:
ring attention and the K/V all-gather (Llama 3).

Each rank holds its tokens of Q, K and V (contiguous or zig-zag split); the
output and the gradients of Q, K and V must equal dense causal attention's on
those tokens, with N-1 messages per pass (forward and backward), and the
work each rank computes shows the zig-zag split's balance. The all-gather
sends the bytes ``calc.comm.context_parallel_gather_comm`` counts (the ring's),
and each method holds the K/V ``calc.comm.context_parallel_kv_bytes`` says.
"""

from __future__ import annotations

import functools

import pytest
import torch

import distlab
from distlab.calc.comm import context_parallel_gather_comm, context_parallel_kv_bytes
from distlab.models import GPTBlock
from distlab.parallel.context.ring import dense_causal_attention, local_positions

B, A, S, D = 2, 3, 16, 8


def inputs():
    gen = torch.Generator().manual_seed(5)
    q, k, v, grad = (torch.randn(B, A, S, D, generator=gen) for _ in range(4))
    return q, k, v, grad


def make_block() -> GPTBlock:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPTBlock(A * D, A, max_seq_len=S)


def block_inputs():
    gen = torch.Generator().manual_seed(6)
    return torch.randn(B, S, A * D, generator=gen), torch.randn(B, S, A * D, generator=gen)


def _worker(rank, world_size):
    torch.set_num_threads(1)
    from distlab.parallel.context.gather import KVGather
    from distlab.parallel.context.ring import (
        ContextParallelBlock,
        Ring,
        ring_attention,
        split_sequence,
    )

    out = {}
    for method, split in [(m, s) for m in ("ring", "gather") for s in ("contiguous", "zigzag")]:
        cp = Ring(split=split) if method == "ring" else KVGather(split=split)
        q, k, v, grad = (split_sequence(t, 2, world_size, rank, split) for t in inputs())
        for t in (q, k, v):
            t.requires_grad_()
        y = ring_attention(q, k, v, cp, S) if method == "ring" else cp.attend(q, k, v, S)
        y.backward(grad)
        out[split if method == "ring" else f"gather {split}"] = {
            "y": y.detach(),
            "grads": [q.grad, k.grad, v.grad],
            "messages": dict(cp.messages),
            "bytes": dict(cp.bytes_sent),
            "work": cp.work,
            "held": cp.kv_bytes_held,
        }
    block = ContextParallelBlock(make_block(), Ring(split="zigzag"), seq_len=S)
    x, grad = (split_sequence(t, 1, world_size, rank, "zigzag") for t in block_inputs())
    x.requires_grad_()
    y = block(x)
    y.backward(grad)
    block.finish_gradients()
    out["block"] = {
        "y": y.detach(),
        "x_grad": x.grad,
        "grads": {n.removeprefix("block."): p.grad for n, p in block.named_parameters()},
    }
    block = ContextParallelBlock(make_block(), KVGather(split="contiguous"), seq_len=S)
    x, grad = (split_sequence(t, 1, world_size, rank, "contiguous") for t in block_inputs())
    x.requires_grad_()
    y = block(x)
    y.backward(grad)
    block.finish_gradients()
    out["gather block"] = {
        "y": y.detach(),
        "x_grad": x.grad,
        "grads": {n.removeprefix("block."): p.grad for n, p in block.named_parameters()},
    }
    return out


@functools.cache
def results(cp: int):
    return distlab.run(_worker, cp, timeout=120, show_output=False)


@functools.cache
def dense():
    q, k, v, grad = inputs()
    for t in (q, k, v):
        t.requires_grad_()
    y = dense_causal_attention(q, k, v)
    y.backward(grad)
    return y.detach(), [q.grad, k.grad, v.grad]


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
@pytest.mark.parametrize("method", ["ring", "gather"])
def test_context_parallel_attention_equals_dense_causal_attention(cp, split, method):
    y, grads = dense()
    key = split if method == "ring" else f"gather {split}"
    for r, res in enumerate(results(cp)):
        mine = local_positions(S, cp, r, split)
        torch.testing.assert_close(res[key]["y"], y[:, :, mine])
        for got, want, name in zip(res[key]["grads"], grads, "qkv", strict=True):
            torch.testing.assert_close(got, want[:, :, mine], msg=f"d{name}")


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_gather_sends_the_rings_bytes_and_holds_every_block(cp):
    shape = {"seq_len": S // cp, "micro_batch": B, "hidden": A * D, "bytes_per_element": 4}
    volume = context_parallel_gather_comm(**shape, layers=1, cp=cp)
    per_phase = {part.what.split()[0]: part.bytes_sent for part in volume.parts}
    for res in results(cp):
        for split in ("contiguous", "zigzag"):
            gather, ring = res[f"gather {split}"], res[split]
            assert gather["bytes"] == per_phase == ring["bytes"]
            assert gather["messages"] == ring["messages"]  # N-1 ring steps each way
            assert gather["held"] == context_parallel_kv_bytes("all_gather", **shape, cp=cp)
            assert ring["held"] == context_parallel_kv_bytes("ring", **shape, cp=cp)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_n_minus_one_messages_per_pass(cp):
    block_bytes = 2 * B * A * (S // cp) * D * 4  # K and V of this rank's tokens, fp32
    for res in results(cp):
        for split in ("contiguous", "zigzag"):
            got = res[split]
            expected = {"forward": cp - 1, "backward": cp - 1} if cp > 1 else {}
            assert got["messages"] == expected
            assert got["bytes"] == {phase: n * block_bytes for phase, n in expected.items()}


@pytest.mark.parametrize("cp", [2, 4])
def test_zigzag_balances_the_causal_work(cp):
    c = S // cp  # tokens per rank
    contiguous = [res["contiguous"]["work"] for res in results(cp)]
    zigzag = [res["zigzag"]["work"] for res in results(cp)]
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
@pytest.mark.parametrize(("key", "split"), [("block", "zigzag"), ("gather block", "contiguous")])
def test_context_parallel_block_equals_dense_block(cp, key, split):
    block = make_block()
    x, grad = block_inputs()
    x.requires_grad_()
    y = block(x)
    y.backward(grad)
    for r, res in enumerate(results(cp)):
        mine = local_positions(S, cp, r, split)
        torch.testing.assert_close(res[key]["y"], y.detach()[:, mine])
        torch.testing.assert_close(res[key]["x_grad"], x.grad[:, mine])
        for name, p in block.named_parameters():
            torch.testing.assert_close(res[key]["grads"][name], p.grad, msg=name)


def _traced(rank, world_size):
    from distlab.parallel.comm.trace import trace_comm
    from distlab.parallel.context.ring import Ring, ring_attention, split_sequence

    ring = Ring()
    q, k, v, grad = (split_sequence(t, 2, world_size, rank, "contiguous") for t in inputs())
    for t in (q, k, v):
        t.requires_grad_()
    with trace_comm() as trace:
        ring_attention(q, k, v, ring, S).backward(grad[:, :, : S // world_size])
    return [(c.group, c.collective, c.wire_bytes) for c in trace.calls]


def test_ring_messages_reach_the_comm_trace_as_cp_sends():
    block_bytes = 2 * B * A * (S // 2) * D * 4
    for calls in distlab.run(_traced, 2, timeout=60, show_output=False):
        assert calls == [("cp", "send", block_bytes), ("cp", "recv", 0)] * 2
