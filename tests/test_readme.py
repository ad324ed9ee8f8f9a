"""The README's and the site pages' code runs: the notebook-cell example, the data-parallel and
pipeline examples, train.py under torchrun, the shell tour; and the README is a landing page.

The reference the README held moved to the site's pages in ``docs/`` (issue 41); each test reads
its example where it now is.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"  # the site's hand-written pages


def page(name: str) -> str:
    """The text of a site page (``docs/<name>``)."""
    return (DOCS / name).read_text()


def code_blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_notebook_cell_example_runs():
    cell = next(b for b in code_blocks("python") if "distlab.run(hello" in b)
    assert cell in code_blocks("python", page("running.md")), "the site page shows the same"
    namespace = {"__name__": "__main__"}
    exec(compile(cell, "README cell", "exec"), namespace)  # noqa: S102
    assert namespace["distlab"].run(namespace["hello"], world_size=4) == [6.0] * 4


def test_data_parallel_example_prints_what_the_readme_says(capsys):
    block = next(b for b in code_blocks("python", page("parallelism.md")) if "training.build(" in b)
    exec(compile(block, "README data-parallel example", "exec"), {"__name__": "__main__"})  # noqa: S102
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == block.rsplit("# ", 1)[1].strip()


def test_pipeline_example_prints_what_the_readme_says(capsys):
    block = next(b for b in code_blocks("python", page("parallelism.md")) if "run_pipeline(" in b)
    exec(compile(block, "README pipeline example", "exec"), {"__name__": "__main__"})  # noqa: S102
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == block.rsplit("# ", 1)[1].strip()
    assert printed[-2] == "(2, 1)"
    assert printed[-3] == "0.2 0.2"
    assert printed[0] == "rank 0: 0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3"


@pytest.mark.slow
def test_train_py_runs_under_torchrun(tmp_path):
    guide = page("running.md")
    script = next(b for b in code_blocks("python", guide) if b.startswith("# train.py"))
    (tmp_path / "train.py").write_text(script)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:0",
            "train.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.findall(r"^sum of ranks: (.*)$", result.stdout, flags=re.MULTILINE) == ["1.0"], (
        result.stdout,
        result.stderr[-3000:],
    )


TOUR = [  # the shell tour on the "What is inside" page
    line
    for line in code_blocks("bash", page("inside.md"))[-1].splitlines()
    if line and not line.startswith("#")
]


@pytest.mark.slow
@pytest.mark.parametrize("command", TOUR)
def test_shell_tour_commands_run(command, tmp_path):
    """Each command runs; none writes to the user data folder (tests/conftest.py points the
    flashcards store at a temporary file; the user data folder is moved here to check)."""
    program, *args = shlex.split(command)
    user_data = tmp_path / "user-data"
    result = subprocess.run(
        [sys.executable, "-m", f"{program}.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "XDG_DATA_HOME": str(user_data)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()
    assert not user_data.exists(), sorted(str(p) for p in user_data.rglob("*"))


def test_the_course_run_time_promise_is_what_the_benchmark_checks(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "course_runtime", Path(__file__).parent.parent / "benchmarks" / "course_runtime.py"
    )
    benchmark = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, benchmark)  # dataclasses look their module up
    spec.loader.exec_module(benchmark)
    promise = re.search(
        r"Each notebook runs in under (\d+) s on 2 cores, with its kernel and worker processes"
        r" together\s+under (\d+(?:\.\d+)?) GB of memory",
        page("course.md"),
    )
    assert promise, "the course page no longer states the run-time and memory bars"
    assert float(promise[1]) == benchmark.TIME_BAR_S
    assert float(promise[2]) * 1e9 == benchmark.MEMORY_BAR_BYTES
    run = benchmark.NotebookRun("x", benchmark.TIME_BAR_S - 1, 10**9, cells=3, errors=0)
    assert benchmark.meets_bars(run)
    assert not benchmark.meets_bars(benchmark.NotebookRun("x", benchmark.TIME_BAR_S, 1, 3, 0))
    assert not benchmark.meets_bars(benchmark.NotebookRun("x", 1, 10**9, cells=3, errors=1))
    assert benchmark.meets_bars(benchmark.NotebookRun("x", 1, 10**9, 3, 1), expect_errors=True)


# ------------------------------------------------------------------ a landing page ---
def test_the_readme_is_a_landing_page():
    assert len(README.splitlines()) < 120, "the README is the landing page: reference goes to docs/"
    setup = next(b for b in code_blocks("bash") if "jupyter lab course/" in b)
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in setup, (
        "the CPU-only install is said inside the set-up commands"
    )
    assert re.search(r'^pip install -e "\.\[test\]" && python -m pytest$', setup, re.MULTILINE), (
        ".ci/run takes the test command from this line"
    )
    assert re.search(
        r'^pip install -e "\.\[site\]" && distlab site build$', README, re.MULTILINE
    ), ".ci/run takes the site's build command from this line"


def test_the_readme_links_lead_to_files():
    links = re.findall(r"\]\(((?!https?://)[^)#\s]+)", README)
    assert any(link.startswith("docs/") for link in links), links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_every_site_page_is_reached_from_the_site_index():
    index = page("index.md")
    toctree = re.search(r"```\{toctree\}\n(.*?)```", index, flags=re.DOTALL).group(1)
    listed = {line.strip() for line in toctree.splitlines() if line and not line.startswith(":")}
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert pages <= listed, f"pages of docs/ no table of contents lists: {pages - listed}"
