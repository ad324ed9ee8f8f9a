"""How long a learner waits for a grade: whole notebook, and one exercise at a time.

    python benchmarks/grading_speed.py [NN ...]

For each notebook (all, or the numbers given) prints, side by side in one run:

* ``run s``: the notebook's plain run time (``nbclient``, the solution, top to bottom, a
  fresh kernel);
* ``grade s``: the wall time of the real command ``distlab grade NN`` run from a work
  folder that holds a solved copy, as a learner runs it (a new process: start-up included);
* ``exercise s``: the slowest and the mean wall time of ``distlab grade NN --exercise K``
  over the notebook's exercises, the same way;
* the points of both paths, and ``same`` when every exercise earned the same points alone
  as in the whole-notebook grade.

The machine's load average (``os.getloadavg``, 1 minute) is printed before and after each
row: on a shared machine, compare only rows taken under similar load. Targets (issue 24,
on 2 quiet cores): one exercise under 15 s; a whole notebook under its run time + 10 s.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from distlab.core.course import assignment_names, find_course_root

ROOT = find_course_root()


def plain_run_s(path: Path, cwd: Path) -> float:
    """Seconds to run the notebook top to bottom in a fresh kernel (start-up included)."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()  # fmt: skip
    return time.perf_counter() - start


def grade(work: Path, *args: str) -> tuple[dict, float]:
    """``distlab grade ARGS --json`` run from ``work``: its result and its wall time."""
    command = [sys.executable, "-m", "distlab.cli", "grade", *args, "--json"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout), seconds


def points_by_id(result: dict) -> dict[str, float]:
    return {e["grade_id"]: e["points"] for e in result["exercises"]}


def measure(name: str) -> str:
    """One row of the table for assignment ``name``."""
    load_before = os.getloadavg()[0]
    source = ROOT / "solutions" / name / f"{name}.ipynb"
    with tempfile.TemporaryDirectory(prefix="distlab-speed-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        shutil.copy(source, work / source.name)
        run_s = plain_run_s(source, Path(tmp))
        whole, grade_s = grade(work, name[:2])
        times, alone = [], {}
        for k in range(1, len(whole["exercises"]) + 1):
            one, seconds = grade(work, name[:2], "--exercise", str(k))
            times.append(seconds)
            alone.update(points_by_id(one))
    same = "same" if alone == points_by_id(whole) else "DIFFER"
    return (
        f"{name:<36} {run_s:>6.1f} {grade_s:>8.1f} {whole['points']:>7g} "
        f"{max(times):>10.1f} / {statistics.mean(times):>5.1f} {sum(alone.values()):>7g} "
        f"{same:>6} {load_before:>5.1f} {os.getloadavg()[0]:>5.1f}"
    )


def main(selected: list[str]) -> None:
    names = [a for a in assignment_names(ROOT) if not selected or a[:2] in selected]
    print(f"{'notebook':<36} {'run s':>6} {'grade s':>8} {'points':>7} "
          f"{'exercise s max / mean':>18} {'points':>7} {'agree':>6} {'load':>5} {'after':>5}")  # fmt: skip
    for name in names:
        print(measure(name), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
