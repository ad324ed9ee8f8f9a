"""How long a learner waits for ``distlab.check(K)`` in the notebook, beside
``distlab grade NN --exercise K`` in a terminal, for every exercise.

    python benchmarks/check_speed.py [NN ...]

For each notebook (all, or the numbers given), from a work folder holding a solved copy:

* ``grade s``: the wall time of the real command ``distlab grade NN.ipynb --exercise K``
  (a new process: start-up, a fresh kernel, the cells the exercise needs);
* ``check s``: the wall time of ``distlab.check(K)`` in the notebook's kernel after the
  whole notebook ran in it once, top to bottom, as a learner's kernel has (torch imported,
  the launcher's workers warm), measured inside the kernel around the call; ``test s`` is
  the part the test cell itself took (the rest: finding the notebook and the exercise,
  scoring, the report);
* ``procs``: ``yes`` when the test cell calls ``distlab.run`` (multi-process: its time is
  the work the test does on the warm pool);
* the points of both, and the machine's load average (1 minute) before each notebook:
  compare only rows taken under similar load. The issue's bar: a single-process exercise
  checks in under 2 s on a quiet machine.

Nothing is recorded in the learner's data folder: ``$DISTLAB_DATA_DIR`` points at a
temporary folder while this runs, and the checks pass ``record=False``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from distlab.core.course import assignment_names, find_course_root, source_notebook
from distlab.grading.cells import grade_id_of, graded_cells
from distlab.grading.mutants import Kernel, check_cell, check_result
from distlab.grading.record import DATA_ENV_VAR

ROOT = find_course_root()


def grade_exercise_s(work: Path, notebook: Path, k: int) -> tuple[float, float]:
    """(points, wall seconds) of ``distlab grade NOTEBOOK --exercise K`` run from ``work``."""
    command = [sys.executable, "-m", "distlab.cli", "grade", str(notebook), "--exercise", str(k)]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--json"], cwd=work, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"exercise {k} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)["points"], seconds


def measure(name: str) -> list[str]:
    """The table's rows for assignment ``name``."""
    load = os.getloadavg()[0]
    source = nbformat.read(source_notebook(ROOT, name), as_version=4)
    tests = graded_cells(source)
    rows = []
    with tempfile.TemporaryDirectory(prefix="distlab-check-speed-") as tmp:
        work = Path(tmp) / "work"
        shutil.copytree(source_notebook(ROOT, name).parent, work)
        notebook = work / f"{name}.ipynb"
        graded = [grade_exercise_s(work, notebook, k) for k in range(1, len(tests) + 1)]
        with Kernel(str(work), timeout=600) as kernel:
            for cell in source.cells:
                if cell.cell_type == "code":
                    kernel.run(cell.source)
            checks = [
                check_result(kernel.run(check_cell(k, str(notebook))))
                for k in range(1, len(tests) + 1)
            ]
    for k, (cell, (grade_points, grade_s), check) in enumerate(zip(tests, graded, checks), 1):
        title = cell.metadata.get("distlab", {}).get("exercise", grade_id_of(cell))
        procs = "yes" if "distlab.run(" in _with_helpers(source, cell) else "no"
        rows.append(
            f"{name[:2]:<3} {k:>2} {title[:34]:<34} {procs:>5} {check['wall_s']:>8.2f} "
            f"{check['test_s']:>7.2f} {grade_s:>8.1f} {check['points']:>6g} {grade_points:>6g} "
            f"{load:>5.1f}"
        )
    return rows


def _with_helpers(source, test_cell) -> str:
    """The test cell's code and the code of every cell before it that defines a function it
    calls (the helpers that launch processes live in read-only cells above the tests)."""
    from distlab.grading.slicing import needed_cells

    cells = [c for c in source.cells if c.cell_type == "code"]
    target = next(i for i, c in enumerate(cells) if c is test_cell)
    keep = needed_cells([c.source for c in cells], [target])
    return "\n".join(cells[i].source for i in keep if cells[i].source.count("def ") or i == target)


def main(selected: list[str]) -> None:
    os.environ[DATA_ENV_VAR] = tempfile.mkdtemp(prefix="distlab-check-speed-data-")
    names = [a for a in assignment_names(ROOT) if not selected or a[:2] in selected]
    print(f"{'nb':<3} {'ex':>2} {'exercise':<34} {'procs':>5} {'check s':>8} {'test s':>7} "
          f"{'grade s':>8} {'check':>6} {'grade':>6} {'load':>5}")  # fmt: skip
    try:
        for name in names:
            for row in measure(name):
                print(row, flush=True)
    finally:
        shutil.rmtree(os.environ[DATA_ENV_VAR], ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
