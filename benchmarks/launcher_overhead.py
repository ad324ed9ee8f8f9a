"""Launcher overhead: a cold launch (fresh processes import torch) against warm relaunches.

    python benchmarks/launcher_overhead.py

Times `distlab.run` of a function that only returns its rank, for 2 and 4
ranks: the first launch with `warm=False`, then five launches reusing the
warm worker pool (target: well under a second each).
"""

import statistics
import time

import distlab
from distlab.progress import progress_bar


def noop(rank, world_size):
    return rank


def main() -> None:
    print(f"{'ranks':>5} {'cold launch (s)':>16} {'warm median (s)':>16} {'warm max (s)':>13}")
    with progress_bar("launches", total=2 * 7) as bar:
        for n in (2, 4):
            bar.step(f"{n} ranks")
            distlab.shutdown()
            start = time.perf_counter()
            distlab.run(noop, n, warm=False)
            cold = time.perf_counter() - start
            distlab.run(noop, n)  # fills the pool
            bar.advance(2)
            warm = []
            for _ in range(5):
                start = time.perf_counter()
                assert distlab.run(noop, n) == list(range(n))
                warm.append(time.perf_counter() - start)
                bar.advance()
            print(f"{n:>5} {cold:>16.2f} {statistics.median(warm):>16.3f} {max(warm):>13.3f}")


if __name__ == "__main__":
    main()
