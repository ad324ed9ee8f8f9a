"""Tensor parallelism on 1-4 gloo ranks against the dense tiny GPT it was sharded from.

One launch per tensor-parallel degree t runs a GPT block forward and backward
(sequence parallelism's block: test_parallel_sequence.py) and the whole GPT's
loss and gradients, and returns each rank's outputs, gradients and the
collectives it issued; the tests compare them with the dense modules run in
this process. Shapes: hidden 48, 12 heads, 12 tokens, so t = 1, 2, 3, 4 all
divide them; vocabulary 62, so t = 3 and t = 4 pad it (63 and 64 rows).

Tolerance: the row-parallel layer sums t partial products where the dense
layer sums one, so fp32 results agree to rounding (``assert_close`` defaults).
"""

from __future__ import annotations

import functools

import pytest
import torch
from gpt_blocks import Block, dense_block

import distlab
from distlab.calc.comm import tensor_parallel_comm
from distlab.models import GPT, GPTBlock, GPTConfig, gpt_batch
from distlab.parallel.tensor.layers import block_shard

HIDDEN, HEADS, SEQ, BATCH = 48, 12, 12, 2
CONFIG = GPTConfig(vocab=62, seq_len=SEQ, hidden=HIDDEN, heads=HEADS, layers=2)
UNTIED = GPTConfig(
    vocab=62, seq_len=SEQ, hidden=HIDDEN, heads=HEADS, layers=1, tie_embeddings=False
)
VARIANTS = [("gpt", CONFIG, False), ("gpt_sp", CONFIG, True), ("gpt_untied", UNTIED, False)]
BLOCK = Block(HIDDEN, HEADS, SEQ, BATCH, seed=0, data_seed=3)


def _worker(rank, world_size):
    torch.set_num_threads(1)
    from distlab.collectives import count_traffic
    from distlab.parallel.tensor import ParallelBlock, ParallelGPT, TensorParallelComm
    from distlab.parallel.tensor.ops import gather_from_tp, split_to_tp
    from distlab.parallel.tensor.vocab import vocab_parallel_cross_entropy

    comm = TensorParallelComm(algorithm="ring")
    block = ParallelBlock(BLOCK.make(), comm)
    x, grad_y = BLOCK.inputs()
    x.requires_grad_()
    with count_traffic() as traffic:
        y = block(x)
        y.backward(grad_y)
    out = {
        "tp": {
            "y": y.detach(),
            "x_grad": x.grad,
            "grads": {n: p.grad for n, p in block.named_parameters()},
            "events": list(comm.log),
            "bytes": traffic.bytes_sent,
        }
    }
    for variant, config, sp in VARIANTS:
        comm = TensorParallelComm(algorithm="ring")
        model = ParallelGPT(GPT(config, seed=1), comm, sequence_parallel=sp)
        tokens, targets = gpt_batch(BATCH, config, seed=2)
        loss = model.loss(tokens, targets)
        loss.backward()
        model.finish_gradients()
        grads = {n: p.grad for n, p in model.named_parameters()}
        out[variant] = {"loss": loss.detach(), "grads": grads}
    with torch.no_grad():  # Megatron-LM issue 1754: the padding rows counted as vocabulary
        padded = model.tok.weight.shape[0] * world_size
        logits = model(tokens)
        out["unmasked_loss"] = vocab_parallel_cross_entropy(
            logits, targets, comm, start=model.tok.start, vocab=padded
        )
    comm = TensorParallelComm(algorithm="ring")
    x, grad_y = BLOCK.inputs()
    x.requires_grad_()
    y = gather_from_tp(split_to_tp(x, comm), comm)
    y.backward(grad_y)
    out["split_gather"] = {"y": y.detach(), "x_grad": x.grad, "events": list(comm.log)}
    return out


@functools.cache
def results(t: int):
    return distlab.run(_worker, t, timeout=120, show_output=False)


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_parallel_block_equals_dense_block(t):
    y, x_grad, grads = dense_block(BLOCK)
    for r, res in enumerate(results(t)):
        tp = res["tp"]
        torch.testing.assert_close(tp["y"], y)
        torch.testing.assert_close(tp["x_grad"], x_grad)
        assert set(tp["grads"]) == set(grads)
        for name, g in grads.items():
            torch.testing.assert_close(tp["grads"][name], block_shard(name, g, t, r), msg=name)


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_two_all_reduces_forward_two_backward_with_calc_bytes(t):
    expected = tensor_parallel_comm(
        seq_len=SEQ, micro_batch=BATCH, hidden=HIDDEN, layers=1, tp=t, bytes_per_element=4
    )
    for res in results(t):
        events = res["tp"]["events"]
        forward = [e.where for e in events if e.phase == "forward"]
        backward = [e.where for e in events if e.phase == "backward"]
        assert forward == ["attn.proj out", "mlp.fc2 out"]  # g after each row layer
        assert backward == ["mlp in", "attn in"]  # f before each column layer
        assert {e.collective for e in events} == {"all_reduce"}
        assert {e.elements for e in events} == {SEQ * BATCH * HIDDEN}
        assert res["tp"]["bytes"] == expected.total


def dense_gpt_grads(config):
    model = GPT(config, seed=1)
    tokens, targets = gpt_batch(BATCH, config, seed=2)
    loss = model.loss(tokens, targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def gpt_shard(name: str, dense_grad: torch.Tensor, t: int, r: int) -> torch.Tensor:
    """Rank r's slice of a dense GPT gradient; vocabulary rows padded with zeros."""
    if name in ("tok.weight", "head.weight", "head_weight"):
        rows = -(-CONFIG.vocab // t)
        padded = dense_grad.new_zeros(rows * t, dense_grad.shape[1])
        padded[: CONFIG.vocab] = dense_grad
        return padded.chunk(t)[r]
    if name.startswith("blocks."):
        return block_shard(name.split(".", 2)[2], dense_grad, t, r)
    return dense_grad


@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize(("variant", "config"), [(v, c) for v, c, _ in VARIANTS])
def test_parallel_gpt_loss_and_gradients_equal_dense(t, variant, config):
    loss, grads = dense_gpt_grads(config)
    for r, res in enumerate(results(t)):
        got = dict(res[variant]["grads"])
        torch.testing.assert_close(res[variant]["loss"], loss)
        if "head.weight" in grads:  # untied: the parallel model holds its rows as head_weight
            got["head.weight"] = got.pop("head_weight")
        assert set(got) == set(grads)
        for name, g in grads.items():
            torch.testing.assert_close(got[name], gpt_shard(name, g, t, r), msg=name)


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_unmasked_padding_would_shift_the_loss(t):
    loss, _ = dense_gpt_grads(UNTIED)
    for res in results(t):
        if CONFIG.vocab % t:  # padded: the masked loss is right, the unmasked one is not
            assert abs(res["unmasked_loss"].item() - loss.item()) > 1e-3
        else:
            torch.testing.assert_close(res["unmasked_loss"], loss)


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_split_then_gather_is_the_identity_both_ways(t):
    x, grad_y = BLOCK.inputs()
    for res in results(t):
        got = res["split_gather"]
        torch.testing.assert_close(got["y"], x, rtol=0, atol=0)
        torch.testing.assert_close(got["x_grad"], grad_y, rtol=0, atol=0)
        phases = [(e.phase, e.collective) for e in got["events"]]
        assert phases == [("forward", "all_gather"), ("backward", "all_gather")]


STEPS = 20


def train_losses(build) -> list[float]:
    """Losses of STEPS SGD steps on two alternating batches; ``build(GPT) -> model``."""
    model = build(GPT(CONFIG, seed=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for step in range(STEPS):
        tokens, targets = gpt_batch(BATCH, CONFIG, seed=10 + step % 2)
        loss = model.loss(tokens, targets)
        opt.zero_grad()
        loss.backward()
        getattr(model, "finish_gradients", lambda: None)()
        opt.step()
        losses.append(loss.item())
    return losses


def _train(rank, world_size):
    torch.set_num_threads(1)
    from distlab.parallel.tensor import ParallelGPT, TensorParallelComm

    comm = TensorParallelComm(algorithm="builtin")
    return {
        sp: train_losses(lambda dense, sp=sp: ParallelGPT(dense, comm, sequence_parallel=sp))
        for sp in (False, True)
    }


@pytest.mark.slow
def test_twenty_training_steps_on_two_ranks_match_single_process():
    expected = train_losses(lambda dense: dense)
    assert expected[-1] < expected[0] - 0.1  # it really trains
    for per_rank in distlab.run(_train, 2, show_output=False):
        for sequence_parallel, losses in per_rank.items():
            assert losses == pytest.approx(expected, rel=1e-5), f"{sequence_parallel=}"


def _bad_input(rank, world_size, case):
    torch.set_num_threads(1)
    import torch.distributed as dist

    from distlab.parallel.tensor import ParallelBlock, ParallelGPT, TensorParallelComm

    try:
        if case == "heads":
            ParallelBlock(GPTBlock(48, 4), TensorParallelComm())
        elif case == "hidden":
            ParallelGPT(GPT(GPTConfig(hidden=30, heads=3)), TensorParallelComm())
        elif case == "group":
            group = dist.new_group([0, 1])
            TensorParallelComm(group=group)
        elif case == "mismatch":
            ParallelGPT(GPT(CONFIG, seed=rank), TensorParallelComm())
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize(
    "case, message",
    [
        ("heads", "heads=4 is not divisible by the tensor-parallel size 3"),
        ("hidden", "hidden=30 is not divisible by the tensor-parallel size 4"),
        ("mismatch", "differs across the ranks of the tensor-parallel group"),
    ],
)
def test_bad_input_raises_on_every_rank(case, message):
    world = 4 if case == "hidden" else 3
    errors = distlab.run(_bad_input, world, args=(case,), timeout=60, show_output=False)
    assert all(e is not None and message in e for e in errors), errors


def test_a_group_without_the_rank_is_refused():
    errors = distlab.run(_bad_input, 3, args=("group",), timeout=60, show_output=False)
    assert errors[:2] == [None, None]
    assert "rank 2 is not in the tensor-parallel group [0, 1]" in errors[2]


def _unguarded(rank, world_size):
    from distlab.parallel.tensor import ParallelBlock, TensorParallelComm

    ParallelBlock(GPTBlock(48, 4), TensorParallelComm())


def test_bad_input_ends_the_job_without_hanging():
    with pytest.raises(distlab.RankError) as failure:
        distlab.run(_unguarded, 3, timeout=60, show_output=False)
    assert "heads=4 is not divisible" in failure.value.remote_traceback


def test_block_collectives_plot_marks_each_logged_collective():
    from distlab.viz.tensor_plots import STAGES, collective_position, plot_block_collectives

    events = results(2)[0]["tp"]["events"]
    fig = plot_block_collectives(events)
    markers = [line for line in fig.axes[0].lines if line.get_marker() == "v"]
    assert len(markers) == len(events) == 4
    xs = sorted(line.get_xdata()[0] for line in markers)
    # forward: g after proj (4) and fc2 (9); backward (mirrored): f before fc1 and q k v
    assert xs == [len(STAGES) - 6, 4, 9, len(STAGES) - 1]
    assert [collective_position(e.phase, e.where) for e in events] == [4, 9, 4, 9]
    with pytest.raises(ValueError, match="no place in a block"):
        collective_position("forward", "somewhere else")


def test_the_guide_example_prints_what_it_says(capsys):
    import re
    from pathlib import Path

    guide = (Path(__file__).parent.parent / "docs" / "parallelism.md").read_text()  # a site page
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.DOTALL)
    block = next(b for b in blocks if "tensor_parallel_loss" in b)
    exec(compile(block, "guide tensor-parallel example", "exec"), {"__name__": "__main__"})  # noqa: S102
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == block.rsplit("# ", 1)[1].strip()


def test_benchmark_prints_every_method_with_calc_bytes_for_tp(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / "tensor_parallel.py"
    spec = importlib.util.spec_from_file_location("tensor_parallel_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = "--ranks 2 --steps 1 --batch 2 --seq-len 8 --hidden 16 --heads 4 --layers 1"
    bench.main(args.split())
    rows = {
        line.split()[0] + (" contig" if "contig" in line else ""): line.split()
        for line in capsys.readouterr().out.splitlines()[2:]
    }
    assert set(rows) == {"TP", "TP+SP", "CP", "CP contig"}
    tp = tensor_parallel_comm(
        seq_len=8, micro_batch=2, hidden=16, layers=1, tp=2, bytes_per_element=4
    )
    assert rows["TP"][3] == f"{tp.total / 2**10:.1f}"  # KiB sent per rank
    assert rows["CP contig"][-1] == "2.00" and rows["CP"][-1] == "1.00"  # work max / min


TORCHRUN_SCRIPT = """
import torch
import torch.distributed as dist

import distlab
from distlab.models import GPT, GPTConfig, gpt_batch
from distlab.parallel import ParallelGPT, TensorParallelComm


def main(rank, world_size):
    # NCCL when torchrun finds GPUs (distlab.init picks it): the model and data go to this
    # rank's GPU first, and every tensor the parallel layers make follows their device.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = GPTConfig(vocab=62, hidden=32, heads=4)
    dense = GPT(config, seed=0).to(device)
    tokens, targets = (t.to(device) for t in gpt_batch(4, config, seed=1))
    model = ParallelGPT(dense, TensorParallelComm(algorithm="builtin"), sequence_parallel=True)
    loss = model.loss(tokens, targets)
    loss.backward()
    model.finish_gradients()
    if rank == 0:
        print(f"losses {loss.item():.6f} {dense.loss(tokens, targets).item():.6f}")


main(*distlab.init())
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_same_code_runs_under_torchrun(tmp_path):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "tp.py").write_text(TORCHRUN_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "tp.py"]
    root = str(Path(__file__).parent.parent)  # this checkout's distlab, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (parallel, dense), *_ = re.findall(r"^losses (\S+) (\S+)$", result.stdout, flags=re.MULTILINE)
    assert float(parallel) == pytest.approx(float(dense), rel=1e-6)
