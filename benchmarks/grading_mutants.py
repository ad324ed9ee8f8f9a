"""Do the course's tests catch plausible wrong answers? One row per notebook.

    python benchmarks/grading_mutants.py [NN ...]

For every mutants module in tests/mutants/ (or the notebooks named), grades the
solution, the released stub and each mutant of each exercise with
distlab.grading.mutants (one kernel per exercise, prefix cells run once), and
prints mutants tried and caught, and the seconds it took. Exits 1 if a mutant
is not caught, or the solution fails, or the stub passes.
"""

from __future__ import annotations

import sys
import tempfile
import time

from distlab.core.course import find_course_root
from distlab.grading.mutants import CORRECT, check_notebook
from distlab.launch.template import hosting

ROOT = find_course_root()
MUTANTS = ROOT / "tests" / "mutants"


def main(selected: list[str]) -> int:
    files = sorted(MUTANTS.glob("m[0-9][0-9]_*.py"))
    if selected:
        files = [f for f in files if any(f.name.startswith(f"m{s}") for s in selected)]
    with hosting(len(files) > 1):  # a kernel per notebook: starters fork from one template
        return _check(files)


def _check(files: list) -> int:
    print(f"{'notebook':<36} {'exercises':>9} {'mutants':>8} {'caught':>7} {'seconds':>8}")
    bad, total, total_caught = [], 0, 0
    for path in files:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as cwd:
            results = check_notebook(ROOT, path, cwd)
        seconds = time.perf_counter() - start
        mutants = caught = 0
        for solution_id, verdicts in results.items():
            solution, stub, *others, again = verdicts
            correct = [v for v in others if v.variant.startswith(CORRECT)]
            others = [v for v in others if not v.variant.startswith(CORRECT)]
            bad += [
                f"{path.name} {solution_id}: loses points: {v.variant}" for v in correct if v.caught
            ]
            if solution.caught or again.caught:
                bad.append(f"{path.name} {solution_id}: the solution fails: {solution.messages}")
            if not stub.caught:
                bad.append(f"{path.name} {solution_id}: the released stub passes")
            mutants += len(others)
            caught += sum(v.caught for v in others)
            bad += [
                f"{path.name} {solution_id}: not caught: {v.variant}"
                for v in others
                if not v.caught
            ]
        total, total_caught = total + mutants, total_caught + caught
        name = path.stem[1:].replace("_", "-")
        print(f"{name:<36} {len(results):>9} {mutants:>8} {caught:>7} {seconds:>8.1f}")
    print(f"{'all':<36} {'':>9} {total:>8} {total_caught:>7}")
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
