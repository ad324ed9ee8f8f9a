"""The README's code runs: the notebook-cell example, train.py under torchrun, the shell tour."""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).parent.parent / "README.md").read_text()


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_notebook_cell_example_runs():
    cell = next(b for b in code_blocks("python") if "distlab.run(hello" in b)
    namespace = {"__name__": "__main__"}
    exec(compile(cell, "README cell", "exec"), namespace)  # noqa: S102
    assert namespace["distlab"].run(namespace["hello"], world_size=4) == [6.0] * 4


def test_data_parallel_example_prints_what_the_readme_says(capsys):
    block = next(b for b in code_blocks("python") if "training.build(" in b)
    exec(compile(block, "README data-parallel example", "exec"), {"__name__": "__main__"})  # noqa: S102
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == block.rsplit("# ", 1)[1].strip()


def test_pipeline_example_prints_what_the_readme_says(capsys):
    block = next(b for b in code_blocks("python") if "run_pipeline(" in b)
    exec(compile(block, "README pipeline example", "exec"), {"__name__": "__main__"})  # noqa: S102
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == block.rsplit("# ", 1)[1].strip()
    assert printed[-2] == "(2, 1)"
    assert printed[-3] == "0.2 0.2"
    assert printed[0] == "rank 0: 0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3"


@pytest.mark.slow
def test_train_py_runs_under_torchrun(tmp_path):
    script = next(b for b in code_blocks("python") if b.startswith("# train.py"))
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


TOUR = [line for line in code_blocks("bash")[-1].splitlines() if line and not line.startswith("#")]


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
        README,
    )
    assert promise, "the README no longer states the run-time and memory bars"
    assert float(promise[1]) == benchmark.TIME_BAR_S
    assert float(promise[2]) * 1e9 == benchmark.MEMORY_BAR_BYTES
    run = benchmark.NotebookRun("x", benchmark.TIME_BAR_S - 1, 10**9, cells=3, errors=0)
    assert benchmark.meets_bars(run)
    assert not benchmark.meets_bars(benchmark.NotebookRun("x", benchmark.TIME_BAR_S, 1, 3, 0))
    assert not benchmark.meets_bars(benchmark.NotebookRun("x", 1, 10**9, cells=3, errors=1))
    assert benchmark.meets_bars(benchmark.NotebookRun("x", 1, 10**9, 3, 1), expect_errors=True)
