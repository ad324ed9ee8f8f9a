"""One layout object, any parallelism: each layout of tests/test_compose.py, measured against distlab.calc.

    python benchmarks/compose.py [--steps 4] [--layouts tp2_cp2_dp2,...]

Runs :func:`distlab.parallel.compose.train` on 8 gloo processes for each layout of
``tests/test_compose.py`` (its ``CASES``: model, batch and optimizer as there) and prints,
per layout:

* the step time: median over the steps after the first of the slowest rank's step
  (CPU on a shared machine: noisy);
* bytes each rank sent per group in the last step (``ComposedRun.bytes_by_group``: the
  trace's collectives and pipeline messages, the ring's K/V messages under ``"cp"``)
  against :func:`distlab.calc.layout_comm.layout_comm` for that rank: the largest over
  the ranks of each, and whether every rank equals its prediction (target: equal);
* model-state bytes per rank (parameters, gradients, optimizer state at the end) against
  :func:`distlab.calc.layout_comm.layout_model_state` (target: equal), and the most
  activation bytes the pipeline executor held for backward against
  :func:`distlab.calc.memory.peak_bytes`' activations (Korthikanti et al. 2022 per layer x
  layers per stage x micro-batches in flight, on s / cp tokens): not equal, see the note
  printed under the table;
* what a layout costs: the lines of its ``CASES`` entry and the length of the ``Layout``'s
  ``repr`` (a layout is a setting, not a file).
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
from pathlib import Path

import distlab
from distlab.calc.layout_comm import MoESpec, layout_comm, layout_model_state
from distlab.calc.memory import peak_bytes
from distlab.calc.three_d import gpt_spec

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
from test_compose import BATCH, CASES, OPTIMIZER, make_model

ACTIVATION_NOTE = (
    "peak activations differ by design: calc is Korthikanti et al.'s 16-bit GPT layer (dropout\n"
    "masks, s x s scores, nothing else); the run keeps fp32 tensors (x2), no dropout masks, the\n"
    "embedding, logits and loss, the ring's every K/V block under CP (autograd keeps them) and\n"
    "the MoE layers' E x C x h dispatch buffers (not in the dense formula)"
)


def _worker(rank, world_size, layout, config, moe, steps):
    import torch

    from distlab.models import gpt_batch
    from distlab.parallel.compose import train

    torch.set_num_threads(1)
    model = make_model(config, moe)  # the plain model tests/test_compose.py starts from
    tokens, targets = gpt_batch(BATCH, config, seed=1)
    run = train(model, layout, tokens, targets, steps=steps, lr=0.1, optimizer=OPTIMIZER)
    return {
        "rank": run.rank,
        "sent": run.bytes_by_group[-1],
        "model_state": run.model_state_bytes,
        "peak_activations": run.peak_activation_bytes,
        "step_seconds": run.step_seconds,
    }


def case_lines() -> dict[str, int]:
    """Lines of each ``CASES`` entry in tests/test_compose.py."""
    tree = ast.parse((TESTS / "test_compose.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CASES":
            return {
                key.value: value.end_lineno - key.lineno + 1
                for key, value in zip(node.value.keys, node.value.values, strict=True)
            }
    raise ValueError("no CASES in tests/test_compose.py")


def calculated(layout, config, moe, rank: int):
    """(bytes per group, model-state bytes, activation bytes) distlab.calc predicts for ``rank``."""
    spec = gpt_spec(vocab=config.vocab, seq_len=config.seq_len, hidden=config.hidden,
                    heads=config.heads, layers=config.layers,
                    tie_embeddings=config.tie_embeddings)  # fmt: skip
    moe_spec = MoESpec(num_experts=4, **moe) if moe else None
    b = BATCH // (layout.dp * layout.micro_batches)
    comm = layout_comm(spec, layout, rank, micro_batch=b, moe=moe_spec)
    state = layout_model_state(spec, layout, rank, moe=moe_spec).total
    activations = peak_bytes(
        n_params=spec.n_params, layers=spec.layers, hidden=spec.hidden, heads=spec.heads,
        seq_len=spec.seq_len // layout.cp, micro_batch=b, micro_batches=layout.micro_batches,
        tp=layout.tp, pp=layout.pp, sequence_parallel=layout.sequence_parallel,
        schedule=layout.pipeline_schedule, virtual_stages=layout.virtual_stages,
    ).activations  # fmt: skip
    return {g: v.total for g, v in comm.items()}, state, activations


def measure(name: str, steps: int) -> dict:
    layout, config, moe = CASES[name]
    runs = distlab.run(_worker, layout.world_size, args=(layout, config, moe, steps), timeout=600)
    slowest = [max(r["step_seconds"][i] for r in runs) for i in range(steps)]
    groups: dict[str, list] = {}
    equal = True
    states, activations = [], []
    for r in runs:
        want, state, acts = calculated(layout, config, moe, r["rank"])
        equal &= r["sent"] == want
        for g in sorted(set(want) | set(r["sent"])):
            row = groups.setdefault(g, [0, 0])
            row[0] = max(row[0], r["sent"].get(g, 0))
            row[1] = max(row[1], want.get(g, 0))
        states.append((r["model_state"], state))
        activations.append((r["peak_activations"], acts))
    return {
        "layout": layout,
        "step_ms": 1e3 * statistics.median(slowest[1:] or slowest),
        "groups": groups,
        "bytes_equal": equal,
        "state": max(states),
        "state_equal": all(m == c for m, c in states),
        "activations": max(activations),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layouts", default=",".join(CASES), help="comma-separated CASES names")
    args = parser.parse_args()
    lines = case_lines()
    print(f"tiny GPT {CASES['tp2_cp2_dp2'][1]}, batch {BATCH}, {OPTIMIZER}, 8 gloo processes, "
          f"{args.steps} steps (step time: median after the first, slowest rank)\n")  # fmt: skip
    for name in args.layouts.split(","):
        row = measure(name, args.steps)
        layout = row["layout"]
        print(f"{name}: {layout.label()}  [{lines[name]} lines in CASES, "
              f"repr {len(repr(layout))} chars]")  # fmt: skip
        print(f"  step time          {row['step_ms']:9.1f} ms")
        verdict = "every rank equal" if row["bytes_equal"] else "NOT EQUAL on some rank"
        for g, (sent, want) in row["groups"].items():
            print(f"  bytes {g:<12} traced {sent:>9,} calc {want:>11,.0f}  (max over ranks)")
        print(f"  bytes by group     {verdict}")
        (m_state, c_state), (m_act, c_act) = row["state"], row["activations"]
        same = "every rank equal" if row["state_equal"] else "NOT EQUAL on some rank"
        print(f"  model state        {m_state:>9,} calc {c_state:>11,.0f}  ({same})")
        print(f"  peak activations   {m_act:>9,} calc {c_act:>11,.0f}  "
              f"(measured / calc {m_act / c_act:.2f})\n")  # fmt: skip
    print(ACTIVATION_NOTE)


if __name__ == "__main__":
    main()
