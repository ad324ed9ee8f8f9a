"""Sequence parallelism (Korthikanti et al. 2022) on 1, 2 and 4 gloo ranks.

The sequence-parallel block holds s/t tokens per rank in its LayerNorm and
dropout regions; it must compute exactly what the dense block computes on
those tokens, issue an all-gather before each column layer and a
reduce-scatter after each row layer, and keep sbh/t (34 + 5as/h) bytes of
activations per rank (Table 2), which ``distlab.calc`` computes.

Activations are counted with saved-tensor hooks on a bf16 block with dropout
(1-byte masks, as the paper assumes); the measured bytes equal the formula
exactly once LayerNorm's per-token mean and 1/std are set aside (4 tensors of
b x s_local x 1 numbers per layer, which the paper does not count).
"""

from __future__ import annotations

import functools

import pytest
import torch
from gpt_blocks import Block, dense_block

import distlab
from distlab.calc.comm import tensor_parallel_comm
from distlab.calc.memory import activation_bytes_per_layer
from distlab.calc.volume import CommPart
from distlab.models import GPTBlock
from distlab.parallel.tensor.layers import block_shard

HIDDEN, HEADS, SEQ, BATCH = 48, 12, 12, 2
BLOCK = Block(HIDDEN, HEADS, SEQ, BATCH, seed=0, data_seed=3)


MEMORY = {"s": 16, "b": 2, "h": 64, "a": 8}
MODES = {  # name: (sequence_parallel, recompute_attention)
    "tp": (False, False),
    "tp_sp": (True, False),
    "tp_sp_selective": (True, True),
    "tp_selective": (False, True),
}


def _worker(rank, world_size):
    torch.set_num_threads(1)
    from distlab.collectives import count_traffic
    from distlab.parallel.tensor import ParallelBlock, TensorParallelComm
    from distlab.parallel.tensor.activations import measure_saved_activations

    comm = TensorParallelComm(algorithm="ring")
    block = ParallelBlock(BLOCK.make(), comm, sequence_parallel=True)
    x, grad_y = BLOCK.inputs()
    x = x.chunk(world_size, 1)[rank].requires_grad_()
    with count_traffic() as traffic:
        y = block(x)
        y.backward(grad_y.chunk(world_size, 1)[rank])
    out = {
        "y": y.detach(),
        "x_grad": x.grad,
        "grads": {n: p.grad for n, p in block.named_parameters()},
        "events": list(comm.log),
        "bytes": traffic.bytes_sent,
        "memory": {},
    }
    s, b, h, a = MEMORY.values()
    torch.manual_seed(rank)
    for name, (sp, recompute) in MODES.items():
        dense = GPTBlock(h, a, dropout=0.1, max_seq_len=s).to(torch.bfloat16)
        layer = ParallelBlock(
            dense, comm, sequence_parallel=sp, recompute_attention=recompute
        ).train()
        x = torch.randn(b, s // world_size if sp else s, h, dtype=torch.bfloat16)
        x.requires_grad_()
        y, saved = measure_saved_activations(layer, functools.partial(layer, x))
        y.float().sum().backward()  # what was saved was enough for backward
        out["memory"][name] = saved
    return out


@functools.cache
def results(t: int):
    return distlab.run(_worker, t, timeout=120, show_output=False)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_sequence_parallel_block_equals_dense_on_its_tokens(t):
    y, x_grad, grads = dense_block(BLOCK)
    for r, res in enumerate(results(t)):
        torch.testing.assert_close(res["y"], y.chunk(t, 1)[r])
        torch.testing.assert_close(res["x_grad"], x_grad.chunk(t, 1)[r])
        for name, g in grads.items():
            got = res["grads"][name]
            if name.startswith(("ln", "attn.proj.bias", "mlp.fc2.bias")):
                # computed on s/t tokens: a partial gradient, summed by sync_sequence_parallel_grads
                got = sum(other["grads"][name] for other in results(t))
            torch.testing.assert_close(got, block_shard(name, g, t, r), msg=name)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_all_gather_before_column_reduce_scatter_after_row(t):
    calc = tensor_parallel_comm(
        seq_len=SEQ,
        micro_batch=BATCH,
        hidden=HIDDEN,
        layers=1,
        tp=t,
        sequence_parallel=True,
        bytes_per_element=4,
    )
    for res in results(t):
        forward = [(e.collective, e.where) for e in res["events"] if e.phase == "forward"]
        assert forward == [
            ("all_gather", "attn in"),
            ("reduce_scatter", "attn.proj out"),
            ("all_gather", "mlp in"),
            ("reduce_scatter", "mlp.fc2 out"),
        ]
        backward = [(e.collective, e.where) for e in res["events"] if e.phase == "backward"]
        regathers = [w for c, w in backward if w.endswith("(re-gather)")]
        assert regathers == ["mlp in (re-gather)", "attn in (re-gather)"]
        assert sorted(c for c, w in backward if w not in regathers) == [
            "all_gather",
            "all_gather",
            "reduce_scatter",
            "reduce_scatter",
        ]
        assert {e.elements for e in res["events"]} == {SEQ * BATCH * HIDDEN}
        # calc counts Korthikanti's 2 all-gathers + 2 reduce-scatters per pass; Megatron's
        # memory-saving column layer adds one all-gather of the input per column layer
        regather = CommPart("re-gather", "all_gather", t, SEQ * BATCH * HIDDEN * 4, count=2)
        assert res["bytes"] == calc.total + regather.bytes_sent


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("mode", list(MODES))
def test_measured_activation_bytes_equal_korthikanti_table_2(t, mode):
    s, b, h, a = MEMORY.values()
    sp, recompute = MODES[mode]
    formula = activation_bytes_per_layer(
        seq_len=s,
        micro_batch=b,
        hidden=h,
        heads=a,
        tp=t,
        sequence_parallel=sp,
        recompute="selective" if recompute else "none",
    )
    tokens = s // t if sp else s
    for res in results(t):
        saved = res["memory"][mode]
        assert saved.paper == formula
        # 2 norms x (mean, 1/std) per token, kept in the input dtype (bf16) on the CPU
        assert saved.layernorm_stats == 2 * 2 * b * tokens * 2


def test_activation_plot_puts_measured_points_on_table_2_lines():
    from distlab.viz.tensor_plots import plot_activation_bytes

    s, b, h, a = MEMORY.values()
    measured = {
        (t, sp): results(t)[0]["memory"]["tp_sp" if sp else "tp"].paper
        for t in (1, 2, 4)
        for sp in (False, True)
    }
    fig = plot_activation_bytes(measured, seq_len=s, micro_batch=b, hidden=h, heads=a)
    ax = fig.axes[0]
    for line, collection, sp in zip(ax.lines, ax.collections, (False, True), strict=True):
        formula = dict(zip(line.get_xdata(), line.get_ydata(), strict=True))
        assert list(formula) == [1, 2, 4]  # the t that divide 8 heads and 16 tokens, up to 4
        points = {int(x): y for x, y in collection.get_offsets()}
        assert points == {t: measured[(t, sp)] / 2**10 for t in (1, 2, 4)}
        assert points == pytest.approx(formula)
