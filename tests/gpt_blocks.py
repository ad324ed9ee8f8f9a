"""One GPT block on split inputs, shared by the tests of tensor, sequence and context parallelism.

* :class:`Block`: a :class:`~distlab.models.GPTBlock` with the same weights in every
  process (``GPTBlock`` takes no seed), the input and output gradient it runs on, and
  :func:`dense_block`, the dense block's output and gradients that the parallel blocks
  must equal (test_parallel_tensor.py, test_parallel_sequence.py, test_tp_dropout.py).
* :class:`ContextCase`: Q, K, V and the output gradient of one causal attention, and the
  block around it. :func:`worker` runs context-parallel attention and a
  :class:`~distlab.parallel.context.ring.ContextParallelBlock` on this rank's tokens, by
  ring attention (``"ring"``), the K/V all-gather (``"gather"``) or all-to-all
  (``"ulysses"``), each with the contiguous or zig-zag split, and returns the outputs,
  the gradients and what each strategy sent and held; :func:`results` launches it once
  per group size, and the two ``assert_*_equals_dense`` check every rank against dense
  causal attention and the dense block (test_parallel_context.py, test_parallel_ulysses.py).

The tests import this module by name (``from gpt_blocks import ...``: pytest puts this
folder on ``sys.path``, and the launcher gives each worker the parent's), so the workers
unpickle :func:`worker` by reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

import distlab
from distlab.collectives import count_traffic
from distlab.models import GPTBlock
from distlab.parallel.comm.trace import trace_comm
from distlab.parallel.context.gather import KVGather
from distlab.parallel.context.ring import (
    ContextParallelBlock,
    Ring,
    dense_causal_attention,
    local_positions,
    split_sequence,
)
from distlab.parallel.context.ulysses import Ulysses

#: how the context-parallel ranks attend: ring attention, K/V all-gather (Llama 3), Ulysses
STRATEGIES = {"ring": Ring, "gather": KVGather, "ulysses": Ulysses}


@dataclass(frozen=True)
class Block:
    """A ``GPTBlock(hidden, heads)`` with the weights of ``torch.manual_seed(seed)``, and
    its input ``x`` and output gradient, ``batch x seq_len x hidden`` each, drawn from a
    generator seeded with ``data_seed``."""

    hidden: int
    heads: int
    seq_len: int
    batch: int
    seed: int = 0
    data_seed: int = 3
    dropout: float = 0.0

    def make(self) -> GPTBlock:
        """The block, the same in every process (the global generator is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return GPTBlock(self.hidden, self.heads, dropout=self.dropout, max_seq_len=self.seq_len)

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` and the gradient of the block's output."""
        gen = torch.Generator().manual_seed(self.data_seed)
        shape = (self.batch, self.seq_len, self.hidden)
        x = torch.randn(*shape, generator=gen)
        return x, torch.randn(*shape, generator=gen)


def dense_block(block: Block):
    """The dense block's output, input gradient and weight gradients (by parameter name)."""
    dense = block.make()
    x, grad_y = block.inputs()
    x.requires_grad_()
    y = dense(x)
    y.backward(grad_y)
    return y.detach(), x.grad, {n: p.grad for n, p in dense.named_parameters()}


@dataclass(frozen=True)
class ContextCase:
    """Causal attention over ``heads`` heads of ``head_dim`` on ``batch`` sequences of
    ``seq_len`` tokens (Q, K, V and the output gradient from a generator seeded with
    ``seed``), and the GPT block of ``heads x head_dim`` around it (:attr:`block`)."""

    batch: int
    heads: int
    seq_len: int
    head_dim: int
    seed: int
    block_seed: int
    block_data_seed: int

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """Q, K, V and the gradient of the output, ``batch x heads x seq_len x head_dim``."""
        gen = torch.Generator().manual_seed(self.seed)
        shape = (self.batch, self.heads, self.seq_len, self.head_dim)
        return tuple(torch.randn(*shape, generator=gen) for _ in range(4))

    @property
    def block(self) -> Block:
        return Block(self.heads * self.head_dim, self.heads, self.seq_len, self.batch,
                     seed=self.block_seed, data_seed=self.block_data_seed)  # fmt: skip


def attention_on_split(case: ContextCase, rank: int, world_size: int, method: str, split: str):
    """Context-parallel attention on this rank's tokens (``split``) by ``method``, forward
    and backward: the output, the gradients of Q, K and V, and what the strategy counted
    (``messages``, ``bytes`` by phase, ``work``, ``held``), the bytes distlab's collectives
    put on the wire and the calls the comm trace saw, as ``(group, collective, bytes)``."""
    cp = STRATEGIES[method](split=split)
    q, k, v, grad = (split_sequence(t, 2, world_size, rank, split) for t in case.inputs())
    for t in (q, k, v):
        t.requires_grad_()
    with count_traffic() as traffic, trace_comm() as trace:
        y = cp.attend(q, k, v, case.seq_len)
        y.backward(grad)
    return {
        "y": y.detach(),
        "grads": [q.grad, k.grad, v.grad],
        "messages": dict(cp.messages),
        "bytes": dict(cp.bytes_sent),
        "work": cp.work,
        "held": cp.kv_bytes_held,
        "wire": traffic.bytes_sent,
        "calls": [(c.group, c.collective, c.wire_bytes) for c in trace.calls],
    }


def block_on_split(case: ContextCase, rank: int, world_size: int, method: str, split: str):
    """A context-parallel GPT block on this rank's tokens, forward and backward, its weight
    gradients summed over the group: the output, the input gradient and the weight
    gradients (named as the dense block's)."""
    block = ContextParallelBlock(
        case.block.make(), STRATEGIES[method](split=split), seq_len=case.seq_len
    )
    x, grad = (split_sequence(t, 1, world_size, rank, split) for t in case.block.inputs())
    x.requires_grad_()
    y = block(x)
    y.backward(grad)
    block.finish_gradients()
    return {
        "y": y.detach(),
        "x_grad": x.grad,
        "grads": {n.removeprefix("block."): p.grad for n, p in block.named_parameters()},
    }


def worker(rank, world_size, case: ContextCase, attention: tuple = (), blocks: tuple = ()):
    """Each ``(method, split)`` of ``attention`` (:func:`attention_on_split`), then each of
    ``blocks`` (:func:`block_on_split`), in order: ``{"attention": {(method, split): ...},
    "block": {(method, split): ...}}``."""
    torch.set_num_threads(1)
    return {
        "attention": {
            (m, s): attention_on_split(case, rank, world_size, m, s) for m, s in attention
        },
        "block": {(m, s): block_on_split(case, rank, world_size, m, s) for m, s in blocks},
    }


@functools.cache
def results(case: ContextCase, n: int, attention: tuple = (), blocks: tuple = ()) -> list:
    """:func:`worker` on ``n`` gloo ranks (once per arguments), by rank."""
    return distlab.run(worker, n, args=(case, attention, blocks), timeout=120, show_output=False)


@functools.cache
def dense_attention(case: ContextCase):
    """Dense causal attention on the whole sequence: the output and the gradients of Q, K, V."""
    q, k, v, grad = case.inputs()
    for t in (q, k, v):
        t.requires_grad_()
    y = dense_causal_attention(q, k, v)
    y.backward(grad)
    return y.detach(), [q.grad, k.grad, v.grad]


def assert_attention_equals_dense(case: ContextCase, runs: list, method: str, split: str):
    """Every rank's output and Q, K, V gradients are dense attention's on its tokens."""
    y, grads = dense_attention(case)
    for r, res in enumerate(runs):
        got = res["attention"][method, split]
        mine = local_positions(case.seq_len, len(runs), r, split)
        torch.testing.assert_close(got["y"], y[:, :, mine])
        for g, want, name in zip(got["grads"], grads, "qkv", strict=True):
            torch.testing.assert_close(g, want[:, :, mine], msg=f"d{name}")


def assert_block_equals_dense(case: ContextCase, runs: list, method: str, split: str):
    """Every rank's block output and input gradient are the dense block's on its tokens,
    and its (summed) weight gradients the dense block's."""
    y, x_grad, grads = dense_block(case.block)
    for r, res in enumerate(runs):
        got = res["block"][method, split]
        mine = local_positions(case.seq_len, len(runs), r, split)
        torch.testing.assert_close(got["y"], y[:, mine])
        torch.testing.assert_close(got["x_grad"], x_grad[:, mine])
        for name, g in grads.items():
            torch.testing.assert_close(got["grads"][name], g, msg=name)
