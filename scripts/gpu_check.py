"""The checks that need a GPU, in one run of a few minutes: ``python scripts/gpu_check.py``.

On a machine with CUDA GPUs (NCCL), it prints a table and exits 1 if any check fails,
2 if there is no GPU:

1. **collectives on NCCL**: every all-reduce algorithm of
   :data:`distlab.parallel.comm.collectives.ALGORITHMS` on ``min(GPUs, 8)`` ranks, against
   ``torch.distributed.all_reduce`` on the same tensors (fp32, equal to 1e-5);
2. **the composed loop on the GPUs**: :func:`distlab.parallel.compose.train` of the tiny
   GPT under a layout that uses every GPU it can (tensor x data parallelism), against
   one process on one GPU (losses to 1e-4 relative, TF32 off), in fp32 and in bf16
   (to 3e-2, the tolerance tests/test_compose_precision.py justifies);
3. **memory against the calculator**: one rank's model state from the CUDA allocator
   after a step (``torch.cuda.memory_allocated`` minus what was allocated before the
   model was built) against :func:`distlab.calc.layout_comm.layout_model_state`, to the
   allocator's 512-byte rounding per tensor; and the step's peak
   (``max_memory_allocated``) printed next to the calculator's model state plus its
   activations (:mod:`distlab.calc.run_activations`) for the record.

Written for the lent H100/H200 machines, where it has not been run yet: no GPU was lent
to the sessions that wrote it. Everything here also has a CPU test; this script is
what the CPU cannot check.
"""

from __future__ import annotations

import sys

ROWS: list[tuple[str, str, bool]] = []


def record(check: str, detail: str, ok: bool) -> None:
    ROWS.append((check, detail, ok))
    print(f"{'ok  ' if ok else 'FAIL'} {check:<44} {detail}", flush=True)


def _collectives(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.parallel.comm.collectives import ALGORITHMS, Collectives

    out = {}
    for algorithm in ALGORITHMS:
        generator = torch.Generator().manual_seed(rank)
        x = torch.randn(1 << 16, generator=generator).cuda()
        want = x.clone()
        dist.all_reduce(want)
        Collectives(algorithm).all_reduce_sum_(x)
        out[algorithm] = float((x - want).abs().max() / want.abs().max())
    return out


def _compose(rank, world_size, layout, precision):
    import torch

    from distlab.models import GPT, GPTConfig, gpt_batch
    from distlab.parallel.compose import train

    torch.backends.cuda.matmul.allow_tf32 = False
    config = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
    tokens, targets = (t.cuda() for t in gpt_batch(8, config, seed=1))
    before = torch.cuda.memory_allocated()
    run = train(GPT(config, seed=0).cuda(), layout, tokens, targets, steps=5, lr=0.1,
                optimizer="sgd_momentum", precision=precision)  # fmt: skip
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    peak = torch.cuda.max_memory_allocated()
    return run.rank, run.losses, run.model_state_bytes, held, peak, len(run.shards)


def _one_process(precision):
    import torch

    from distlab.models import GPT, GPTConfig, gpt_batch

    torch.backends.cuda.matmul.allow_tf32 = False
    config = GPTConfig(vocab=62, seq_len=8, hidden=32, heads=4, layers=4)
    model = GPT(config, seed=0).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tokens, targets = (t.cuda() for t in gpt_batch(8, config, seed=1))
    losses = []
    for _ in range(5):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model.loss(tokens, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    import torch

    import distlab
    from distlab.calc.layout_comm import layout_model_state
    from distlab.calc.run_activations import layout_activations
    from distlab.calc.three_d import gpt_spec
    from distlab.core.layout import Layout

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to check (the CPU suite covers the rest)")
        return 2
    gpus = torch.cuda.device_count()
    print(f"{gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}\n")
    world = min(gpus, 8)

    gaps = distlab.run(_collectives, world, backend="nccl", timeout=300)[0]
    for algorithm, gap in gaps.items():
        record(f"all-reduce '{algorithm}' on {world} GPUs (NCCL)", f"max rel. gap {gap:.1e}",
               gap <= 1e-5)  # fmt: skip

    tp = 2 if world >= 2 else 1
    layout = Layout(tp=tp, dp=world // tp)
    spec = gpt_spec(vocab=62, seq_len=8, hidden=32, heads=4, layers=4, tie_embeddings=True)
    for precision, rtol in (("fp32", 1e-4), ("bf16", 3e-2)):
        want = _one_process(precision)
        runs = distlab.run(_compose, layout.world_size, args=(layout, precision),
                           backend="nccl", timeout=300)  # fmt: skip
        losses = next(r[1] for r in runs if r[1] is not None)
        gap = max(abs(a - b) / abs(b) for a, b in zip(losses, want, strict=True))
        record(f"compose.train {layout.label()} {precision}", f"max rel. loss gap {gap:.1e}",
               gap <= rtol)  # fmt: skip
        if precision != "fp32":
            continue
        for rank, _, state, held, peak, n_params in runs[:1]:
            calc = layout_model_state(spec, layout, rank).total
            tensors = 3 * n_params  # parameters, gradients, momentum: one block each
            record("model state: run vs calc", f"{state:,} B vs {calc:,.0f} B", state == calc)
            record("model state: CUDA allocator vs calc", f"{held:,} B vs {calc:,.0f} B",
                   calc <= held <= calc + 512 * tensors)  # fmt: skip
            activations, _ = layout_activations(spec, layout, rank, micro_batch=8 // layout.dp)
            print(
                f"     step peak (max_memory_allocated) {peak:,} B; calc model state + "
                f"activations {calc + activations:,.0f} B (for the record)"
            )
    failed = [row for row in ROWS if not row[2]]
    print(f"\n{len(ROWS) - len(failed)} of {len(ROWS)} checks pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
