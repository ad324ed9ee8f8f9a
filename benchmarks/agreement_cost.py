"""What the agreement check costs a composed training run: messages, CPU and step time.

    python benchmarks/agreement_cost.py [--steps 4] [--rounds 3] [--layouts tp2_cp2_dp2,...]

Every distlab collective first exchanges a small header with the other ranks of its group
(:mod:`distlab.collectives.agree`), so that ranks that disagree all raise the same error
instead of hanging. For each layout of ``tests/test_compose.py`` (its ``CASES``), this
runs :func:`distlab.parallel.compose.train` on 8 gloo processes with the check on (as
users run it) and off (:func:`distlab.collectives.agree.unchecked`, for measuring only),
alternating in one job, ``--rounds`` times each, and prints per run, summed over the
ranks:

* the messages the collectives sent (data) and the header messages
  (:func:`distlab.collectives.count_traffic`: ``messages`` and ``header_messages``;
  pipeline sends between stages are not collectives and are in neither);
* the process CPU of the training call, and the step time (the slowest rank's median step
  after the first), each the median over the rounds, with the check on and off.

A layout with expert parallelism is skipped: its all-to-all needs the other ranks' sizes,
so it refuses to run unchecked.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import distlab

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
from test_compose import BATCH, CASES, LR, OPTIMIZER, make_model


def _worker(rank, world_size, layout, config, moe, steps, rounds):
    import contextlib
    import time

    import torch

    from distlab.collectives import count_traffic
    from distlab.collectives.agree import unchecked
    from distlab.models import gpt_batch
    from distlab.parallel.compose import train

    torch.set_num_threads(1)
    tokens, targets = gpt_batch(BATCH, config, seed=1)
    runs = []
    for _ in range(rounds):
        for checked in (True, False):
            model = make_model(config, moe)
            start = time.process_time()
            with count_traffic() as traffic, contextlib.nullcontext() if checked else unchecked():
                run = train(model, layout, tokens, targets, steps=steps, lr=LR,
                            optimizer=OPTIMIZER)  # fmt: skip
            runs.append({
                "checked": checked,
                "cpu": time.process_time() - start,
                "step": statistics.median(run.step_seconds[1:] or run.step_seconds),
                "data": traffic.messages,
                "headers": traffic.header_messages,
            })  # fmt: skip
    return runs


def measure(name: str, steps: int, rounds: int) -> dict | None:
    layout, config, moe = CASES[name]
    if layout.ep > 1:
        return None
    per_rank = distlab.run(_worker, layout.world_size, args=(layout, config, moe, steps, rounds),
                           timeout=1800)  # fmt: skip
    result = {}
    for checked in (True, False):
        by_round = [[r for r in rank_runs if r["checked"] == checked] for rank_runs in per_rank]
        result[checked] = {
            "cpu": statistics.median(sum(rank[i]["cpu"] for rank in by_round) for i in range(rounds)),
            "step": statistics.median(max(rank[i]["step"] for rank in by_round) for i in range(rounds)),
            "data": sum(rank[0]["data"] for rank in by_round),
            "headers": sum(rank[0]["headers"] for rank in by_round),
        }  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(CASES))
    args = parser.parse_args()
    names = [n for n in args.layouts.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown layout(s) {unknown}; allowed: {sorted(CASES)}")
    print(f"{args.steps} steps, 8 gloo ranks, median of {args.rounds} rounds; sums over the ranks")
    print(f"{'layout':<28}{'data msgs':>10}{'header msgs':>12}{'CPU on s':>10}{'CPU off s':>10}"
          f"{'on/off':>8}{'step on ms':>12}{'step off ms':>12}")  # fmt: skip
    for name in names:
        result = measure(name, args.steps, args.rounds)
        if result is None:
            print(f"{name:<28}skipped: its all-to-all cannot run unchecked")
            continue
        on, off = result[True], result[False]
        print(f"{name:<28}{on['data']:>10}{on['headers']:>12}{on['cpu']:>10.1f}{off['cpu']:>10.1f}"
              f"{on['cpu'] / off['cpu']:>8.2f}{on['step'] * 1e3:>12.0f}{off['step'] * 1e3:>12.0f}")  # fmt: skip
        assert off["headers"] == 0, f"{name}: header messages sent with the check off"


if __name__ == "__main__":
    main()
