"""One layout object, any parallelism: each layout of tests/test_compose.py, measured against distlab.calc.

    python benchmarks/compose.py [--steps 4] [--layouts tp2_cp2_dp2,...]
                                 [--precisions fp32,bf16] [--recompute none,full]

Runs :func:`distlab.parallel.compose.train` on 8 gloo processes for each layout of
``tests/test_compose.py`` (its ``CASES``: model, batch and optimizer as there), in each
precision and recomputation mode asked for, and prints, per run:

* the step time: median over the steps after the first of the slowest rank's step
  (CPU on a shared machine: noisy);
* bytes each rank sent per group in the last step (``ComposedRun.bytes_by_group``: the
  trace's collectives and pipeline messages, the ring's K/V messages under ``"cp"``)
  against :func:`distlab.calc.layout_comm.layout_comm` for that rank: the largest over
  the ranks of each, and whether every rank equals its prediction (target: equal);
* model-state bytes per rank (parameters, gradients, optimizer state at the end) against
  :func:`distlab.calc.layout_comm.layout_model_state` (target: equal; autocast keeps the
  parameters fp32, so bf16 holds the same bytes), and the most activation bytes the
  pipeline executor held for backward on each rank against
  :func:`distlab.calc.run_activations.layout_activations` (target: measured / calc 1.00 on
  every rank), with the calculator's terms for the rank with the largest peak (the MoE
  layers' kept-token indices from the assignments the run reports kept, step by step:
  the peak is the largest step's); where the count refuses a run, the line says why;
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
from distlab.calc.run_activations import layout_activations
from distlab.calc.three_d import gpt_spec

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
from test_compose import BATCH, CASES, OPTIMIZER, make_model


def _worker(rank, world_size, layout, config, moe, steps, precision):
    import torch

    from distlab.models import gpt_batch
    from distlab.parallel.compose import train

    torch.set_num_threads(1)
    model = make_model(config, moe)  # the plain model tests/test_compose.py starts from
    tokens, targets = gpt_batch(BATCH, config, seed=1)
    run = train(model, layout, tokens, targets, steps=steps, lr=0.1, optimizer=OPTIMIZER,
                precision=precision)  # fmt: skip
    return {
        "rank": run.rank,
        "sent": run.bytes_by_group[-1],
        "model_state": run.model_state_bytes,
        "peak_activations": run.peak_activation_bytes,
        "step_seconds": run.step_seconds,
        "moe_kept": run.moe_kept,
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


def calculated(layout, config, moe, rank: int, precision: str, kept: list):
    """(bytes per group, model-state bytes, (peak activation bytes, terms) or the reason the
    count leaves this run out) distlab.calc predicts for ``rank``; ``kept``: per step, the
    assignments the rank's MoE layers kept (``ComposedRun.moe_kept``)."""
    spec = gpt_spec(vocab=config.vocab, seq_len=config.seq_len, hidden=config.hidden,
                    heads=config.heads, layers=config.layers,
                    tie_embeddings=config.tie_embeddings)  # fmt: skip
    moe_spec = MoESpec(num_experts=4, **moe) if moe else None
    b = BATCH // (layout.dp * layout.micro_batches)
    comm = layout_comm(spec, layout, rank, micro_batch=b, moe=moe_spec, precision=precision)
    state = layout_model_state(spec, layout, rank, moe=moe_spec).total
    width = 4 if precision == "fp32" else 2
    try:
        by_step = [
            layout_activations(spec, layout, rank, micro_batch=b, bytes_per_element=width,
                               moe=moe_spec, kept=step if moe else None)
            for step in kept
        ]  # fmt: skip
        activations = max(by_step, key=lambda peak_and_terms: peak_and_terms[0])
    except ValueError as error:
        activations = str(error)
    return {g: v.total for g, v in comm.items()}, state, activations


def measure(name: str, steps: int, precision: str, recompute: str) -> dict:
    layout, config, moe = CASES[name]
    layout = layout.with_(recompute=recompute)
    runs = distlab.run(_worker, layout.world_size, args=(layout, config, moe, steps, precision),
                       timeout=600)  # fmt: skip
    slowest = [max(r["step_seconds"][i] for r in runs) for i in range(steps)]
    groups: dict[str, list] = {}
    equal = True
    states, activations = [], []
    for r in runs:
        want, state, acts = calculated(layout, config, moe, r["rank"], precision, r["moe_kept"])
        equal &= r["sent"] == want
        for g in sorted(set(want) | set(r["sent"])):
            row = groups.setdefault(g, [0, 0])
            row[0] = max(row[0], r["sent"].get(g, 0))
            row[1] = max(row[1], want.get(g, 0))
        states.append((r["model_state"], state))
        activations.append((r["peak_activations"], acts))
    counted = [(m, c) for m, c in activations if not isinstance(c, str)]
    return {
        "layout": layout,
        "step_ms": 1e3 * statistics.median(slowest[1:] or slowest),
        "groups": groups,
        "bytes_equal": equal,
        "state": max(states),
        "state_equal": all(m == c for m, c in states),
        "activations": max(counted, key=lambda mc: mc[0]) if len(counted) == len(runs) else None,
        "activations_equal": len(counted) == len(runs) and all(m == c[0] for m, c in counted),
        "not_counted": next((c for _, c in activations if isinstance(c, str)), None),
        "measured_peak": max(m for m, _ in activations),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layouts", default=",".join(CASES), help="comma-separated CASES names")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32,bf16")
    parser.add_argument("--recompute", default="none,full", help="comma-separated: none,full")
    args = parser.parse_args()
    lines = case_lines()
    print(f"tiny GPT {CASES['tp2_cp2_dp2'][1]}, batch {BATCH}, {OPTIMIZER}, 8 gloo processes, "
          f"{args.steps} steps (step time: median after the first, slowest rank)\n")  # fmt: skip
    runs = [(n, p, r) for n in args.layouts.split(",") for p in args.precisions.split(",")
            for r in args.recompute.split(",")]  # fmt: skip
    for name, precision, recompute in runs:
        row = measure(name, args.steps, precision, recompute)
        layout = row["layout"]
        print(f"{name} {precision}: {layout.label()}  [{lines[name]} lines in CASES, "
              f"repr {len(repr(layout))} chars]")  # fmt: skip
        print(f"  step time          {row['step_ms']:9.1f} ms")
        verdict = "every rank equal" if row["bytes_equal"] else "NOT EQUAL on some rank"
        for g, (sent, want) in row["groups"].items():
            print(f"  bytes {g:<12} traced {sent:>9,} calc {want:>11,.0f}  (max over ranks)")
        print(f"  bytes by group     {verdict}")
        m_state, c_state = row["state"]
        same = "every rank equal" if row["state_equal"] else "NOT EQUAL on some rank"
        print(f"  model state        {m_state:>9,} calc {c_state:>11,.0f}  ({same})")
        if row["activations"] is None:
            print(f"  peak activations   {row['measured_peak']:>9,} calc  not counted: "
                  f"{row['not_counted']}\n")  # fmt: skip
            continue
        m_act, (c_act, chunks) = row["activations"]
        same = "every rank" if row["activations_equal"] else "NOT on every rank"
        print(f"  peak activations   {m_act:>9,} calc {c_act:>11,.0f}  "
              f"(measured / calc {m_act / c_act:.2f}, {same})")  # fmt: skip
        for chunk in chunks:
            for term, value in chunk.terms.items():
                print(f"      chunk {chunk.chunk}, one micro-batch: {term:<58} {value:>9,.0f}")
            for term, value in chunk.once.items():
                print(f"      chunk {chunk.chunk}, once:            {term:<58} {value:>9,.0f}")
        print()


if __name__ == "__main__":
    main()
