"""How long each course notebook takes to run, and how much memory it needs.

    python benchmarks/course_runtime.py                  # every solutions/ notebook
    python benchmarks/course_runtime.py --released       # the course/ notebooks (stubs fail fast)
    python benchmarks/course_runtime.py --cores 1 00-launching   # as on a 1-core Binder
    python benchmarks/course_runtime.py --binder         # Binder's limits; exit 1 if over

Each notebook runs top to bottom in a fresh kernel (``nbclient``). A sampler
thread adds up the memory (PSS, so shared libraries count once) of every
process this script started, the kernel and the worker processes
``distlab.run`` spawns from it, every 0.1 s, and keeps the peak.

The bars, which the course page (docs/course.md) states and ``tests/test_readme.py`` keeps equal to these
constants: each notebook runs in under TIME_BAR_S seconds, and its processes together
(kernel and workers) stay under MEMORY_BAR_BYTES (Binder offers 2 GB). The script exits
with status 1 if a notebook misses a bar, or if a ``solutions/`` notebook has a cell
that raised. ``--cores N`` pins this script and so everything it starts to N CPUs.

``--binder``: mybinder.org's limits, 1 CPU and 2 GB for all processes together. Every
solution notebook runs pinned to one core (kernel and ranks share it), the table reports
time and peak memory, and the exit status is 1 if a notebook goes over the bars (peak
memory is measured, not enforced: the sampler sees what a 2 GB limit would kill).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import nbformat
import psutil
from nbclient import NotebookClient

from distlab.progress import progress_bar

ROOT = Path(__file__).resolve().parents[1]
TIME_BAR_S = 60.0
MEMORY_BAR_BYTES = 2e9


@dataclass
class NotebookRun:
    name: str
    seconds: float
    peak_bytes: int
    cells: int
    errors: int


class PeakMemory:
    """Peak memory of this process's descendants, sampled in a background thread.

    Counted as PSS (proportional set size): a page shared by k processes (the
    torch libraries every worker maps) counts 1/k in each, so the sum is the
    memory the processes really occupy together. A plain sum of RSS would
    count the shared libraries once per process.
    """

    def __init__(self, interval_s: float = 0.1):
        self.interval_s, self.peak, self._stop = interval_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for child in me.children(recursive=True):
                try:
                    total += child.memory_full_info().pss
                except psutil.Error:  # the process ended between listing and reading
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_notebook(path: Path, timeout_s: int) -> NotebookRun:
    nb = nbformat.read(path, as_version=4)
    env_path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ["PATH"] = env_path  # the kernel (and torchrun in notebook 00) use this Python
    client = NotebookClient(
        nb,
        timeout=timeout_s,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    with PeakMemory() as memory:
        start = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - start
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = sum(any(o.output_type == "error" for o in c.outputs) for c in code)
    return NotebookRun(path.parent.name, seconds, memory.peak, len(code), errors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", help="e.g. 00-launching (default: all)")
    parser.add_argument("--released", action="store_true", help="run course/ instead of solutions/")
    parser.add_argument("--cores", type=int, help="pin to this many CPUs (children inherit it)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    # -- Binder limits mode (issue 18) --------------------------------------------------------
    parser.add_argument(
        "--binder", action="store_true", help="1 core, solutions/, exit 1 over the bars"
    )
    args = parser.parse_args()
    if args.binder:
        if args.released or args.cores not in (None, 1):
            parser.error("--binder runs solutions/ on 1 core; drop --released/--cores")
        args.cores = 1
    # -- end of Binder limits mode --------------------------------------------------------------
    if args.cores is not None:
        available = sorted(os.sched_getaffinity(0))
        if not 1 <= args.cores <= len(available):
            parser.error(f"--cores must be in 1..{len(available)}, got {args.cores}")
        os.sched_setaffinity(0, available[: args.cores])
    folder = ROOT / ("course" if args.released else "solutions")
    names = args.assignments or sorted(p.name for p in folder.iterdir() if any(p.glob("*.ipynb")))
    cores = len(os.sched_getaffinity(0))
    print(
        f"{folder.name}/ notebooks on {cores} CPU core(s); bars: < {TIME_BAR_S:g} s, "
        f"< {MEMORY_BAR_BYTES / 1e9:g} GB for all processes"
    )
    print(f"{'notebook':<24} {'time s':>8} {'peak MB':>9} {'cells':>6} {'errors':>7}  bars")
    runs = []
    paths = [path for name in names for path in sorted((folder / name).glob("*.ipynb"))]
    with progress_bar("notebooks", total=len(paths)) as bar:
        for path in paths:
            bar.step(path.stem)
            run = run_notebook(path, args.timeout)
            runs.append(run)
            ok = meets_bars(run, expect_errors=args.released)
            print(
                f"{run.name:<24} {run.seconds:8.1f} {run.peak_bytes / 1e6:9.0f} {run.cells:6d} "
                f"{run.errors:7d}  {'ok' if ok else 'OVER'}",
                flush=True,
            )
            bar.advance()
    total = sum(r.seconds for r in runs)
    peak = max((r.peak_bytes for r in runs), default=0)
    print(f"{'total':<24} {total:8.1f} {peak / 1e6:9.0f}")
    failed = [r.name for r in runs if not meets_bars(r, expect_errors=args.released)]
    if failed:
        print(f"missed a bar (time, memory or a cell that raised): {', '.join(failed)}")
    if args.binder:  # Binder limits mode: one core for the kernel and every rank
        print("Binder limits: " + ("all fit" if not failed else "missed in " + ", ".join(failed)))
    return 1 if failed else 0


def meets_bars(run: NotebookRun, *, expect_errors: bool = False) -> bool:
    """Under both bars, and (for a solution notebook) no cell raised."""
    in_bars = run.seconds < TIME_BAR_S and run.peak_bytes < MEMORY_BAR_BYTES
    return in_bars and (expect_errors or run.errors == 0)


if __name__ == "__main__":
    sys.exit(main())
