"""How fast distlab.placement is at scale: one job on ~100,000 GPUs, 1,000 jobs on 1,024 GPUs.

Targets (issue 5): placing one job on a 100,000-GPU cluster in under 1 s;
simulating 1,000 jobs on 1,024 GPUs in under 10 s. Prints the best of
``--repeat`` runs of each, in seconds.

    python benchmarks/placement_scale.py
"""

from __future__ import annotations

import argparse
import time

from distlab.core.layout import Layout
from distlab.placement import Job, place
from distlab.placement.jobs import mixed_jobs
from distlab.placement.scheduler import simulate
from distlab.sim.topology import preset


def best_of(repeat: int, fn) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    big = preset("dgx-h100", nodes=12_500)  # 100,000 GPUs
    job = Job("big", Layout(tp=8, pp=8, dp=1562, micro_batches=8))  # 99,968 GPUs
    seconds, placement = best_of(args.repeat, lambda: place(job, big))
    score_s, score = best_of(args.repeat, placement.score)
    print(
        f"place {job.layout.label()} ({job.layout.world_size} GPUs) on {big.world_size} GPUs: "
        f"{seconds:.3f} s (target < 1 s), order {placement.order}, "
        f"violations {len(placement.violations())}"
    )
    print(f"  score again: {score_s:.3f} s; communication {score.total * 1e3:.1f} ms/step")

    cluster = preset("dgx-h100", nodes=128)
    jobs = mixed_jobs(1000, cluster_gpus=cluster.world_size, load=1.0, seed=0)
    for policy in ("first-fit", "best-fit"):
        seconds, result = best_of(args.repeat, lambda p=policy: simulate(jobs, cluster, policy=p))
        s = result.stats()
        print(
            f"simulate 1000 jobs on {cluster.world_size} GPUs, {policy}: {seconds:.3f} s "
            f"(target < 10 s), {result.events} events, {s.completed} completed, "
            f"utilisation {s.utilisation:.1%}, mean wait {s.mean_wait_s / 60:.1f} min"
        )


if __name__ == "__main__":
    main()
