"""Dense, tensor-, sequence- and context-parallel GPT blocks on 1, 2 and 4 ranks, side by side.

    python benchmarks/tensor_parallel.py [--ranks 1,2,4] [--steps 5] [--batch 4]
                                         [--seq-len 64] [--hidden 64] [--heads 4] [--layers 2]

For each number of gloo ranks, one launch runs forward and backward of the
tiny GPT's transformer blocks (``distlab.models.GPT``'s) with each method:

* ``dense``: the blocks themselves (one rank only);
* ``TP``: :class:`distlab.parallel.ParallelBlock` (Megatron tensor parallelism);
* ``TP+SP``: the same with ``sequence_parallel=True`` (Korthikanti et al. 2022);
* ``CP``: :class:`distlab.parallel.ContextParallelBlock` (ring attention, zig-zag split);
* ``CP contig``: the same on the contiguous split, whose causal work is uneven.

and prints per method and rank count: the median step time of the slowest
rank, the bytes one rank sends per step (distlab's ring collectives and the
ring's point-to-point messages, counted as they are sent) and the activation
bytes one rank keeps for backward (saved-tensor hooks, fp32, LayerNorm
statistics included), and for CP the attention work (score elements computed
per forward) of the busiest rank over the idlest. Timings on a shared CPU are
noisy; bytes and work are exact.
"""

from __future__ import annotations

import argparse
import statistics

import distlab
from distlab.core.units import format_bytes

METHODS = ("dense", "TP", "TP+SP", "CP", "CP contig")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    shape = (args.batch, args.seq_len, args.hidden, args.heads, args.layers)
    rows = []
    for n in (int(r) for r in args.ranks.split(",")):
        per_rank = distlab.run(_worker, n, args=(shape, args.steps), timeout=600)
        for method in METHODS:
            if method not in per_rank[0]:
                continue
            steps = zip(*(r[method]["times"] for r in per_rank), strict=True)
            slowest = statistics.median(max(step) for step in steps)
            sent = max(r[method]["bytes"] for r in per_rank)
            kept = max(r[method]["activations"] for r in per_rank)
            work = [r[method]["work"] for r in per_rank]
            balance = f"{max(work) / min(work):.2f}" if min(work) else "-"
            rows.append((method, n, slowest * 1e3, sent, kept, balance))
    b, s, h, a, layers = shape
    print(
        f"tiny GPT blocks: {layers} layers, batch {b}, seq_len {s}, hidden {h}, {a} heads, fp32; "
        f"gloo on CPU, median of {args.steps} steps (slowest rank)"
    )
    header = ("method", "ranks", "step ms", "sent/rank", "activations/rank", "work max/min")
    print("{:<10} {:>5} {:>9} {:>12} {:>17} {:>13}".format(*header))
    for method, n, ms, sent, kept, balance in rows:
        sent_kib, kept_kib = format_bytes(sent, "KiB", 1), format_bytes(kept, "KiB", 1)
        print(f"{method:<10} {n:>5} {ms:>9.2f} {sent_kib:>12} {kept_kib:>17} {balance:>13}")


def _worker(rank, world_size, shape, steps):
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from distlab.collectives import count_traffic
    from distlab.models import GPT, GPTConfig
    from distlab.parallel import ContextParallelBlock, ParallelBlock, Ring, TensorParallelComm
    from distlab.parallel.context.ring import split_sequence
    from distlab.parallel.tensor.activations import measure_saved_activations
    from distlab.parallel.tensor.sequence import sync_sequence_parallel_grads

    b, s, h, a, layers = shape
    blocks = GPT(GPTConfig(vocab=64, seq_len=s, hidden=h, heads=a, layers=layers)).blocks
    gen = torch.Generator().manual_seed(0)
    x_full, grad_full = torch.randn(b, s, h, generator=gen), torch.randn(b, s, h, generator=gen)
    comm = TensorParallelComm(algorithm="ring")
    methods = {}
    if world_size == 1:
        methods["dense"] = (torch.nn.Sequential(*blocks), x_full, grad_full, lambda m: None)
    methods["TP"] = (
        torch.nn.Sequential(*(ParallelBlock(blk, comm) for blk in blocks)),
        x_full,
        grad_full,
        lambda m: None,
    )
    methods["TP+SP"] = (
        torch.nn.Sequential(*(ParallelBlock(blk, comm, sequence_parallel=True) for blk in blocks)),
        x_full.chunk(world_size, 1)[rank],
        grad_full.chunk(world_size, 1)[rank],
        lambda m: sync_sequence_parallel_grads(m, comm),
    )
    rings = {"CP": Ring(split="zigzag"), "CP contig": Ring(split="contiguous")}
    for name, ring in rings.items():
        methods[name] = (
            torch.nn.Sequential(*(ContextParallelBlock(blk, ring, seq_len=s) for blk in blocks)),
            split_sequence(x_full, 1, world_size, rank, ring.split),
            split_sequence(grad_full, 1, world_size, rank, ring.split),
            lambda m: [blk.finish_gradients() for blk in m],
        )
    results = {}
    for name, (model, x, grad, finish) in methods.items():
        ring = rings.get(name, Ring())

        def step(model=model, x=x, grad=grad, finish=finish):
            model.zero_grad(set_to_none=True)
            model(x.detach().requires_grad_()).backward(grad)
            finish(model)

        step()  # warm-up
        ring_before = sum(ring.bytes_sent.values())
        with count_traffic() as traffic:
            step()
        sent = traffic.bytes_sent + sum(ring.bytes_sent.values()) - ring_before
        work_before = ring.work
        model(x)
        work = ring.work - work_before  # attention scores computed by one forward (CP only)
        out, saved = measure_saved_activations(model, lambda m=model, x=x: m(x.requires_grad_()))
        out.backward(grad)
        times = []
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        results[name] = {"times": times, "bytes": sent, "activations": saved.total, "work": work}
    return results


if __name__ == "__main__":
    main()
