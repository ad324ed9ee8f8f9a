"""binder/ builds what pyproject.toml promises: the Python and torch versions it pins
satisfy the project's requirements, postBuild installs this package with every step
failing loudly, keeps only the learner's nbgrader extensions (names checked against the
installed nbgrader), and the README's badge opens the first course notebook.

repo2docker cannot run here; scripts/binder_env_check.sh builds the same environment in
a fresh venv (slow, not in CI).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import nbgrader
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
POSTBUILD = (BINDER / "postBuild").read_text()
NBGRADER_LAB = Path(sys.prefix) / "share/jupyter/labextensions/@jupyter/nbgrader"
STUDENT_PLUGINS = {"validate-assignment"}
# off: the instructor's tools, and the assignment list, which needs an exchange that a
# course sets up and Binder has not (it showed "Error fetching courses!", issue 36 §0)
OFF_PLUGINS = {"formgrader", "create-assignment", "course-list", "assignment-list"}
STUDENT_SERVER = {"validate_assignment"}
OFF_SERVER = {"formgrader", "course_list", "assignment_list"}


def binder_requirements() -> dict[str, Requirement]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(line) for line in lines if line.strip() and line[0] not in "#-"]
    return {r.name: r for r in reqs}


def project_requirement(name: str) -> Requirement:
    return next(r for r in map(Requirement, PYPROJECT["dependencies"]) if r.name == name)


def pinned(requirement: Requirement) -> Version:
    (spec,) = requirement.specifier
    assert spec.operator == "==", f"binder pins exact versions, got {requirement}"
    return Version(spec.version)


def test_python_version_is_one_nbgrader_installs_on():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(3\.\d+)", runtime)
    assert match, f"runtime.txt must read python-3.X, got {runtime!r}"
    python = Version(match.group(1))
    assert python in SpecifierSet(PYPROJECT["requires-python"])
    assert python >= Version("3.11"), "repo2docker's default 3.10 cannot install nbgrader 0.9.6"


def test_torch_is_the_cpu_build_and_satisfies_pyproject():
    text = (BINDER / "requirements.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text
    torch = pinned(binder_requirements()["torch"])
    assert torch.local == "cpu", f"pin the CPU build (torch==X+cpu), got {torch}"
    assert torch in project_requirement("torch").specifier
    ci = (ROOT / ".ci/run").read_text()
    assert f"torch=={torch.public}" in ci, "CI and Binder should test the same torch"


def test_requirements_name_only_torch_the_rest_comes_from_pyproject():
    assert set(binder_requirements()) == {"torch"}
    assert re.search(r"^python -m pip install --no-cache-dir \.$", POSTBUILD, re.MULTILINE)


def test_postbuild_fails_loudly():
    assert POSTBUILD.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in POSTBUILD
    assert (BINDER / "postBuild").stat().st_mode & 0o111, "postBuild must be executable"
    assert "|| true" not in POSTBUILD


def postbuild_names(command: str) -> set[str]:
    """The names postBuild runs ``command`` on: over a ``for x in a b c; do <command> ...$x``
    loop, or one name on a line of its own."""
    loops = re.findall(r"for \w+ in ([^;]+); do\n(.*?)\ndone", POSTBUILD, re.DOTALL)
    names = {name for names, body in loops if command in body for name in names.split()}
    prefix = r"(?:@jupyter/nbgrader:|nbgrader\.server_extensions\.)"
    return names | set(
        re.findall(rf"{command} [^\n]*{prefix}([\w-]+)\"?$", POSTBUILD, re.MULTILINE)
    )


def test_only_the_learner_side_of_nbgrader_is_on():
    assert postbuild_names("labextension disable") == OFF_PLUGINS
    assert postbuild_names("labextension lock") == OFF_PLUGINS
    assert postbuild_names("labextension enable") == STUDENT_PLUGINS
    assert postbuild_names("server extension disable") == OFF_SERVER
    assert postbuild_names("server extension enable") == STUDENT_SERVER


def test_extension_names_exist_in_the_installed_nbgrader():
    assert nbgrader.__version__ == str(pinned(project_requirement("nbgrader")))
    bundle = "".join(p.read_text(errors="replace") for p in NBGRADER_LAB.glob("static/*.js"))
    if not bundle:
        pytest.fail(f"nbgrader's labextension is not at {NBGRADER_LAB}")
    for plugin in STUDENT_PLUGINS | OFF_PLUGINS:
        assert f'"@jupyter/nbgrader:{plugin}"' in bundle, plugin
    for module in STUDENT_SERVER | OFF_SERVER:
        assert importlib.util.find_spec(f"nbgrader.server_extensions.{module}"), module


def test_readme_badge_opens_the_first_notebook():
    readme = (ROOT / "README.md").read_text()
    badge = re.search(r"\[!\[[^\]]*\]\(https://mybinder\.org/badge[^)]*\)\]\(([^)]+)\)", readme)
    assert badge, "README needs a mybinder.org badge"
    url = urlparse(badge.group(1))
    assert url.netloc == "mybinder.org" and url.path.startswith("/v2/gh/")
    (urlpath,) = parse_qs(url.query)["urlpath"]
    first = min((ROOT / "course").glob("*/*.ipynb"))
    assert urlpath == f"lab/tree/{first.relative_to(ROOT).as_posix()}"
