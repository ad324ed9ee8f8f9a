"""`distlab grade NAME` grades the learner's own file (issue 24 §1).

Resolution is checked directly (fast); the command itself runs twice as a subprocess from
a work folder: a solved copy (full marks, exit 0) by name and an unsolved one (zero, exit 1)
by relative path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distlab import grading
from distlab.grading.resolve import resolve_notebook

ROOT = grading.find_course_root()
NUMBER, ASSIGNMENT, POINTS = "13", "13-sharded-matmuls-and-overlap", 8  # the quickest to grade
SOLVED = ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
UNSOLVED = ROOT / "course" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"


def _copy(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
    return target


@pytest.mark.parametrize("given", [NUMBER, ASSIGNMENT, f"{ASSIGNMENT}/", f"{ASSIGNMENT}.ipynb"])
@pytest.mark.parametrize("where", [f"{ASSIGNMENT}.ipynb", f"{ASSIGNMENT}/{ASSIGNMENT}.ipynb"])
def test_a_name_finds_the_copy_in_the_current_folder(tmp_path, given, where):
    mine = _copy(SOLVED, tmp_path / where)
    found = resolve_notebook(given, cwd=tmp_path)
    assert found.path == mine.resolve() and found.note is None
    assert (found.assignment, found.notebook) == (ASSIGNMENT, ASSIGNMENT)


def test_a_renamed_copy_is_found_by_its_test_cells(tmp_path):
    mine = _copy(SOLVED, tmp_path / "my attempt.ipynb")
    (tmp_path / "notes.ipynb").write_text("{ not a notebook")  # skipped, not an error
    _copy(ROOT / "course" / "01-memory-anatomy" / "01-memory-anatomy.ipynb", tmp_path / "b.ipynb")
    assert resolve_notebook(NUMBER, cwd=tmp_path).path == mine.resolve()
    with pytest.raises(ValueError, match=r"'\.' fits 2 notebooks"):  # a folder: any assignment
        resolve_notebook(".", cwd=tmp_path)


def test_a_folder_is_its_one_course_notebook(tmp_path):
    mine = _copy(SOLVED, tmp_path / "work" / "attempt.ipynb")
    assert resolve_notebook("work", cwd=tmp_path).path == mine.resolve()
    _copy(UNSOLVED, tmp_path / "work" / "again.ipynb")
    with pytest.raises(ValueError, match="fits 2 notebooks"):
        resolve_notebook("work/", cwd=tmp_path)


def test_without_a_copy_here_the_course_file_is_graded_and_said_so(tmp_path):
    found = resolve_notebook(NUMBER, cwd=tmp_path)
    assert found.path == UNSOLVED.resolve()
    assert found.note == f"no copy of it in {tmp_path}: graded the course's own file"


def test_several_candidates_are_refused_and_listed(tmp_path):
    """By the real command: exit 2, both files named, nothing graded."""
    first = _copy(SOLVED, tmp_path / f"{ASSIGNMENT}.ipynb")
    second = _copy(UNSOLVED, tmp_path / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    done = subprocess.run(
        [sys.executable, "-m", "distlab.cli", "grade", NUMBER],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"'{NUMBER}' fits 2 notebooks" in done.stderr and "Nothing was graded" in done.stderr
    assert str(first.resolve()) in done.stderr and str(second.resolve()) in done.stderr
    assert done.stdout == ""


def _grade(work: Path, given: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(work.parent / "tmp")}
    (work.parent / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "distlab.cli", "grade", given],
        cwd=work, env=env, capture_output=True, text=True, check=False, timeout=800,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grade_a_solved_copy_by_name_from_a_work_folder(tmp_path):
    work = tmp_path / "work"
    mine = _copy(SOLVED, work / f"{ASSIGNMENT}.ipynb")
    done = _grade(work, NUMBER)
    assert done.returncode == 0, done.stdout + done.stderr  # full marks: a script may go on
    assert done.stdout.startswith(f"{ASSIGNMENT}: {POINTS} / {POINTS} points\n"), done.stdout
    assert f"graded {mine.resolve()} (modified " in done.stdout
    assert "note:" not in done.stdout and "FAILED" not in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grade_an_unsolved_copy_by_relative_path(tmp_path):
    work = tmp_path / "work"
    mine = _copy(UNSOLVED, work / "attempts" / "first.ipynb")
    done = _grade(work, "attempts/first.ipynb")
    assert done.returncode == 1, done.stdout + done.stderr  # below full marks
    assert done.stdout.startswith(f"{ASSIGNMENT}: 0 / {POINTS} points\n"), done.stdout
    assert f"graded {mine.resolve()} (modified " in done.stdout
    assert list((tmp_path / "tmp").iterdir()) == [], "temporary folders were left"
