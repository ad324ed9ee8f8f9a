"""How long a learner waits for a grade: whole notebook, and one exercise at a time.

    python benchmarks/grading_speed.py [NN ...]

For each notebook (all, or the numbers given) prints, side by side in one run:
the notebook's plain run time (nbclient, the solution, top to bottom), the
time of ``distlab grade NN`` on the solution (nbgrader in a throw-away course
directory), and the slowest and mean time of ``distlab grade NN --exercise K``
over its exercises, with the points each path gave (they must agree).
Targets (issue 24, on 2 quiet cores): one exercise under 15 s; a whole notebook
under its own run time plus 10 s.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from distlab import grading

ROOT = grading.find_course_root()


def plain_run_s(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": cwd}}).execute()  # fmt: skip
    return time.perf_counter() - start


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main(selected: list[str]) -> None:
    names = [a for a in grading.assignment_names(ROOT) if not selected or a[:2] in selected]
    print(f"{'notebook':<36} {'run s':>6} {'grade s':>8} {'points':>7} "
          f"{'exercise s (max / mean)':>24} {'points':>7}")  # fmt: skip
    for name in names:
        path = ROOT / "solutions" / name / f"{name}.ipynb"
        run_s = plain_run_s(path)
        whole, grade_s = timed(grading.grade_notebook, path)
        times, points = [], 0.0
        for k in range(1, len(whole.exercises) + 1):
            one, seconds = timed(grading.grade_exercise, path, k)
            times.append(seconds)
            points += one.points
        print(
            f"{name:<36} {run_s:>6.1f} {grade_s:>8.1f} {whole.points:>7g} "
            f"{max(times):>12.1f} / {statistics.mean(times):>9.1f} {points:>7g}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
