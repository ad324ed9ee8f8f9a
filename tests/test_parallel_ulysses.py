"""DeepSpeed-Ulysses (all-to-all sequence parallelism) on 1, 2 and 4 gloo ranks against dense attention.

Each rank holds its tokens of Q, K and V (contiguous or zig-zag split); the
output and the gradients of Q, K and V must equal dense causal attention's on
those tokens, a GPT block with Ulysses attention must equal the dense block
(output, input gradient, every weight gradient), the bytes each rank sends
must equal ``calc.comm.ulysses_comm`` and the wire count, and a head count
the group cannot divide is refused by name.
"""

from __future__ import annotations

import functools

import pytest
import torch

import distlab
from distlab.calc.comm import context_parallel_kv_bytes, ulysses_comm
from distlab.models import GPTBlock
from distlab.parallel.context.ring import dense_causal_attention, local_positions

B, A, S, D = 2, 4, 16, 8


def inputs():
    gen = torch.Generator().manual_seed(7)
    return tuple(torch.randn(B, A, S, D, generator=gen) for _ in range(4))


def make_block() -> GPTBlock:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return GPTBlock(A * D, A, max_seq_len=S)


def block_inputs():
    gen = torch.Generator().manual_seed(8)
    return torch.randn(B, S, A * D, generator=gen), torch.randn(B, S, A * D, generator=gen)


def _worker(rank, world_size):
    torch.set_num_threads(1)
    from distlab.collectives import count_traffic
    from distlab.parallel.comm.trace import trace_comm
    from distlab.parallel.context.ring import ContextParallelBlock, split_sequence
    from distlab.parallel.context.ulysses import Ulysses, ulysses_attention

    out = {}
    for split in ("contiguous", "zigzag"):
        cp = Ulysses(split=split)
        q, k, v, grad = (split_sequence(t, 2, world_size, rank, split) for t in inputs())
        for t in (q, k, v):
            t.requires_grad_()
        with count_traffic() as traffic, trace_comm() as trace:
            y = ulysses_attention(q, k, v, cp, S)
            y.backward(grad)
        out[split] = {
            "y": y.detach(),
            "grads": [q.grad, k.grad, v.grad],
            "calls": dict(cp.messages),
            "bytes": dict(cp.bytes_sent),
            "wire": traffic.bytes_sent,
            "traced": sum(c.wire_bytes for c in trace.calls if c.collective == "all_to_all"),
            "held": cp.kv_bytes_held,
        }
    block = ContextParallelBlock(make_block(), Ulysses(split="zigzag"), seq_len=S)
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
    return out


@functools.cache
def results(n: int):
    return distlab.run(_worker, n, timeout=120, show_output=False)


@functools.cache
def dense():
    q, k, v, grad = inputs()
    for t in (q, k, v):
        t.requires_grad_()
    y = dense_causal_attention(q, k, v)
    y.backward(grad)
    return y.detach(), [q.grad, k.grad, v.grad]


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
def test_ulysses_attention_equals_dense_causal_attention(n, split):
    y, grads = dense()
    for r, res in enumerate(results(n)):
        mine = local_positions(S, n, r, split)
        torch.testing.assert_close(res[split]["y"], y[:, :, mine])
        for got, want, name in zip(res[split]["grads"], grads, "qkv", strict=True):
            torch.testing.assert_close(got, want[:, :, mine], msg=f"d{name}")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_four_all_to_alls_each_way_send_what_calc_counts(n):
    volume = ulysses_comm(
        seq_len=S // n, micro_batch=B, hidden=A * D, layers=1, cp=n, bytes_per_element=4
    )
    per_phase = {part.what.split()[0]: part.bytes_sent for part in volume.parts}
    for res in results(n):
        got = res["zigzag"]
        assert got["calls"] == ({"forward": 4, "backward": 4} if n > 1 else {})
        assert got["bytes"] == {phase: b for phase, b in per_phase.items()}
        assert got["wire"] == volume.total  # what distlab's all-to-all put on the wire
        assert got["traced"] == volume.total  # and what the comm trace saw
        assert got["held"] == context_parallel_kv_bytes(
            "ulysses", seq_len=S // n, micro_batch=B, hidden=A * D, cp=n, bytes_per_element=4
        )


@pytest.mark.parametrize("n", [1, 2, 4])
def test_ulysses_block_equals_dense_block(n):
    block = make_block()
    x, grad = block_inputs()
    x.requires_grad_()
    y = block(x)
    y.backward(grad)
    for r, res in enumerate(results(n)):
        mine = local_positions(S, n, r, "zigzag")
        torch.testing.assert_close(res["block"]["y"], y.detach()[:, mine])
        torch.testing.assert_close(res["block"]["x_grad"], x.grad[:, mine])
        for name, p in block.named_parameters():
            torch.testing.assert_close(res["block"]["grads"][name], p.grad, msg=name)


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
