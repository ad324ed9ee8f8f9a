"""``distlab grade`` from a plain (non-editable) install, as on Binder (issue 36 §0).

Binder's ``postBuild`` runs ``pip install .``; a learner may do the same. The installed
package is then imported from site-packages, with no checkout above it, so the grader
must find the course it carries (``distlab/_course/``, copied there by ``setup.py``).
This test builds and installs the package the same way (``--no-deps`` into a folder of
its own, from a copy of the repository's files, so the checkout is left as it was), then
grades from a work folder outside any course: a solved copy of notebook 13 earns full
marks, the released copy none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distlab import grading

ROOT = grading.find_course_root()
NUMBER, ASSIGNMENT, POINTS = "13", "13-sharded-matmuls-and-overlap", 8  # the quickest to grade
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "nbgrader_config.py")
FOLDERS = ("distlab", "flashcards", "solutions", "course")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder with distlab installed as `pip install .` installs it (no dependencies)."""
    base = tmp_path_factory.mktemp("plain-install")
    source = base / "source"
    source.mkdir()
    for name in SOURCES:
        shutil.copy2(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "_course")
    for name in FOLDERS:
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    site = base / "site"
    # build with this environment's setuptools when it meets pyproject's build requirement
    # (quick, offline); a fresh Python 3.11 venv has 65.5, so pip then builds in isolation
    isolation = ["--no-build-isolation"] if _setuptools_version() >= (68,) else []
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
         "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def _setuptools_version() -> tuple[int, ...]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(part) for part in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):  # not installed, or an unusual version string
        return (0,)


def _env(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != grading.ROOT_ENV_VAR}
    env["PYTHONPATH"] = str(site)  # before the editable checkout on sys.path
    return env


def test_the_package_carries_the_course(installed):
    course = installed / "distlab" / "_course"
    assert (course / "nbgrader_config.py").is_file()
    for assignment in grading.assignment_names(ROOT):
        assert (course / "solutions" / assignment / f"{assignment}.ipynb").is_file(), assignment
        assert (course / "course" / assignment / f"{assignment}.ipynb").is_file(), assignment
    assert not list(course.rglob(".ipynb_checkpoints"))


def test_the_installed_package_finds_its_own_course(installed, tmp_path):
    probe = "import distlab, distlab.core.course as c; print(distlab.__file__); print(c.find_course_root())"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=_env(installed),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    module, root = done.stdout.split()
    assert Path(module).is_relative_to(installed), "the test imported the checkout, not the install"
    assert Path(root) == (installed / "distlab" / "_course").resolve()


@pytest.mark.parametrize(("copy_of", "points"), [("solutions", POINTS), ("course", 0)])
def test_grade_from_a_work_folder_with_a_plain_install(installed, tmp_path, copy_of, points):
    work = tmp_path / "work"
    work.mkdir()
    mine = work / f"{ASSIGNMENT}.ipynb"
    shutil.copy2(ROOT / copy_of / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", mine)
    done = subprocess.run(
        [sys.executable, "-m", "distlab.cli", "grade", NUMBER], cwd=work, env=_env(installed),
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == (0 if points == POINTS else 1), done.stdout + done.stderr
    assert done.stdout.startswith(f"{ASSIGNMENT}: {points} / {POINTS} points\n"), done.stdout
    assert f"graded {mine.resolve()} (modified " in done.stdout
