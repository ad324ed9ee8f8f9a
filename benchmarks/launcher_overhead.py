"""Launcher overhead: fresh processes, forked ones, and warm relaunches, side by side.

    python benchmarks/launcher_overhead.py

Times `distlab.run` of a function that only returns its rank, for 2 and 4 ranks:

* ``fresh python``: ``warm=False``, every worker a new Python that imports torch;
* ``first, forked``: the first warm launch after ``shutdown()``: the starter imports torch
  once and forks the workers (Linux; elsewhere this is another fresh start);
* ``after a failure``: the launch right after a job whose rank raised (its workers are not
  reused, so new ones are forked from the running starter);
* ``warm median`` and ``warm max``: five launches reusing the warm pool.
"""

import statistics
import time

import distlab
from distlab.progress import progress_bar


def noop(rank, world_size):
    return rank


def fails(rank, world_size):
    raise RuntimeError("on purpose")


def seconds(fn, n, **kwargs) -> float:
    start = time.perf_counter()
    try:
        distlab.run(fn, n, **kwargs)
    except distlab.RankError:
        pass
    return time.perf_counter() - start


def main() -> None:
    print(f"{'ranks':>5} {'fresh python (s)':>17} {'first, forked (s)':>18} "
          f"{'after a failure (s)':>20} {'warm median (s)':>16} {'warm max (s)':>13}")  # fmt: skip
    with progress_bar("launches", total=2 * 9) as bar:
        for n in (2, 4):
            bar.step(f"{n} ranks")
            distlab.shutdown()
            fresh = seconds(noop, n, warm=False)
            distlab.shutdown()
            first = seconds(noop, n)
            seconds(fails, n, show_output=False)
            after_failure = seconds(noop, n)
            bar.advance(4)
            warm = []
            for _ in range(5):
                warm.append(seconds(noop, n))
                bar.advance()
            print(f"{n:>5} {fresh:>17.2f} {first:>18.2f} {after_failure:>20.2f} "
                  f"{statistics.median(warm):>16.3f} {max(warm):>13.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
