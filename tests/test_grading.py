"""`distlab grade`: finding the course, recognising a notebook, reporting, and one real grading."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest

from distlab import cli, grading
from distlab.grading import report as grading_report
from distlab.grading.cells import failure, kernel_deaths

ROOT = grading.find_course_root()
ASSIGNMENT = "01-memory-anatomy"  # the fastest notebook to execute (no worker processes)
RELEASED = ROOT / "course" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
SOURCE = ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"


def _cell(nb, grade_id: str):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def test_find_course_root(tmp_path, monkeypatch):
    assert (ROOT / "nbgrader_config.py").is_file() and (ROOT / "solutions").is_dir()
    with pytest.raises(FileNotFoundError, match="no distlab course in"):
        grading.find_course_root(tmp_path)
    monkeypatch.setenv(grading.ROOT_ENV_VAR, str(ROOT))
    assert grading.find_course_root() == ROOT


def _fake_course(folder):
    (folder / "solutions" / "00-x").mkdir(parents=True)
    (folder / "nbgrader_config.py").write_text("c = get_config()\n")
    return folder


def test_the_course_is_found_from_the_learners_folder_first(tmp_path, monkeypatch):
    """Issue 36 §0: on Binder and after `pip install .` the course is where the learner
    works: the current folder or a parent (checked before the checkout distlab came from)."""
    from distlab.core import course

    monkeypatch.delenv(grading.ROOT_ENV_VAR, raising=False)
    clone = _fake_course(tmp_path / "clone")
    inside = clone / "course" / "07-x"
    inside.mkdir(parents=True)
    assert course.find_course_root(cwd=clone) == clone.resolve()
    assert course.find_course_root(cwd=inside) == clone.resolve()  # a parent
    monkeypatch.setenv(grading.ROOT_ENV_VAR, str(ROOT))
    assert course.find_course_root(cwd=inside) == ROOT  # the variable comes first
    reasons = [why for _, why in course.course_root_candidates(inside)]
    assert reasons[0] == f"${grading.ROOT_ENV_VAR}" and reasons[1] == "the current folder"
    assert reasons[-2:] == [
        "the checkout distlab was imported from",
        "the course installed with distlab",
    ]


def test_without_a_course_anywhere_the_error_says_what_to_do(tmp_path, monkeypatch):
    from distlab.core import course

    monkeypatch.delenv(grading.ROOT_ENV_VAR, raising=False)
    monkeypatch.setattr(course, "_PACKAGE_CHECKOUT", tmp_path / "nothing")
    monkeypatch.setattr(course, "PACKAGED_COURSE", tmp_path / "not-installed")
    with pytest.raises(FileNotFoundError) as error:
        course.find_course_root(cwd=tmp_path)
    message = str(error.value)
    assert "installed without it" in message and "pip install ." in message
    assert grading.ROOT_ENV_VAR in message
    monkeypatch.setattr(course, "PACKAGED_COURSE", _fake_course(tmp_path / "installed"))
    assert course.find_course_root(cwd=tmp_path) == (tmp_path / "installed").resolve()


def test_identify_released_and_renamed_notebooks(tmp_path):
    assert grading.identify(RELEASED) == (ASSIGNMENT, ASSIGNMENT)
    renamed = tmp_path / "my work.ipynb"
    renamed.write_bytes(RELEASED.read_bytes())
    assert grading.identify(renamed) == (ASSIGNMENT, ASSIGNMENT)


def test_identify_rejects_what_is_not_a_course_notebook(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such notebook"):
        grading.identify(tmp_path / "missing.ipynb")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a notebook"):
        grading.identify(text)
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{ not json")
    with pytest.raises(ValueError, match="could not be read"):
        grading.identify(broken)
    foreign = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("assert 1 + 1 == 2")])
    foreign.cells[0].metadata["nbgrader"] = {
        "grade": True,
        "grade_id": "someone-elses",
        "points": 1,
    }
    nbformat.write(foreign, tmp_path / "foreign.ipynb")
    with pytest.raises(ValueError, match="not part of the distlab course"):
        grading.identify(tmp_path / "foreign.ipynb")


def test_a_timeout_is_a_whole_number_of_seconds(capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["grade", "00", "--timeout", "7"]).timeout == 7
    for bad in ("0", "-3", "1.5", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["grade", "00", "--timeout", bad])
        assert f"{bad!r} is not a whole number of seconds >= 1" in capsys.readouterr().err


def test_cli_errors_are_one_clear_line(capsys, tmp_path):
    assert cli.main(["grade", str(tmp_path / "missing.ipynb")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("distlab grade: error: no such notebook") and "Traceback" not in err


def test_failure_keeps_the_failing_ranks_own_error():
    rank_error = {
        "output_type": "error",
        "ename": "RankError",
        "evalue": "rank 1 failed with AssertionError; every rank was stopped.\n"
        '--- traceback from rank 1 ---\n  File "<cell>", line 3\nAssertionError: got [3.0]',
    }
    assert failure([rank_error]) == (
        "RankError: rank 1 failed with AssertionError; every rank was stopped.\n"
        "AssertionError: got [3.0]"
    )
    plain = {"output_type": "error", "ename": "NotImplementedError", "evalue": ""}
    assert failure([{"output_type": "stream", "text": "hi"}, plain]) == "NotImplementedError"
    assert failure([{"output_type": "stream", "text": "hi"}]) is None
    long = {
        "output_type": "error",
        "ename": "AssertionError",
        "evalue": "idle share: yours is 0.62, expected 0.3\nline 2\nline 3\nline 4",
    }
    assert failure([long]).splitlines() == [
        "AssertionError: idle share: yours is 0.62, expected 0.3", "line 2", "line 3", "line 4"
    ], "a check's whole message is shown, not its first line only"  # fmt: skip


def test_report_lists_points_failures_and_review_commands():
    grade = grading.NotebookGrade(
        ASSIGNMENT,
        ASSIGNMENT,
        [
            grading.ExerciseScore(
                "a", "Bytes per parameter", 2, 2, None, f"{ASSIGNMENT}#bytes-per-parameter"
            ),
            grading.ExerciseScore(
                "b", "Backward by hand", 0, 3, "AssertionError: grad_w1", f"{ASSIGNMENT}#backprop"
            ),
        ],
        edited_test_cells=["b"],
        path="/home/me/work/mine.ipynb",
        modified="2026-11-25 01:02:03",
    )
    report = grading.format_report(grade)
    assert report.startswith(
        f"{ASSIGNMENT}: 2 / 5 points\n"
        "graded /home/me/work/mine.ipynb (modified 2026-11-25 01:02:03)\n"
    )
    assert re.search(
        r"Backward by hand\s+0/3\s+FAILED\n\s+your copy of this test cell was edited: graded "
        r"with the original test\n\s+AssertionError: grad_w1",
        report,
    )
    assert f"flashcards drill --notebook {ASSIGNMENT}#backprop" in report
    assert "reread the notebook's section #backprop" in report
    assert "#bytes-per-parameter" not in report.split("Review")[1], (
        "passed exercises are not suggested"
    )
    assert "were edited (b)" in report


def _check_the_learners_graded_copy(copy: Path, kept: Path) -> None:
    """Issue 36 §4: --keep writes the learner's graded copy, not the instructor's source:
    every cell ran, the test cells read as released, no hidden test's code anywhere."""
    assert copy == (kept / RELEASED.name).resolve() and list(kept.iterdir()) == [copy]
    ran = nbformat.read(copy, as_version=4)
    released = {c.get("id"): c.source for c in nbformat.read(RELEASED, as_version=4).cells}
    source = nbformat.read(SOURCE, as_version=4)
    hidden = [c.source.split("### BEGIN HIDDEN TESTS")[1] for c in source.cells
              if "### BEGIN HIDDEN TESTS" in c.source]  # fmt: skip
    text = nbformat.writes(ran)
    assert hidden and not any(h.strip()[:60] in text for h in hidden), "hidden tests kept"
    assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text
    tests = [c for c in ran.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert tests and all(c.source == released[c.get("id")] for c in tests)
    errors = [o for c in tests for o in c.outputs if o.output_type == "error"]
    assert errors and all(len(o.traceback) == 1 for o in errors), "tracebacks show cell lines"
    assert all(c.execution_count for c in ran.cells if c.cell_type == "code" and c.source.strip())


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole grade and three exercises: slow on a busy machine
def test_grade_a_partly_solved_notebook_with_an_edited_test(tmp_path, capsys):
    """End to end through the CLI: one exercise solved, one test cell gutted by the learner."""
    learner = nbformat.read(RELEASED, as_version=4)
    solution = _cell(nbformat.read(SOURCE, as_version=4), "bytes-per-parameter").source
    _cell(learner, "bytes-per-parameter").source = re.sub(
        r"\s*### (BEGIN|END) SOLUTION", "", solution
    )
    _cell(learner, "test-manual-backward").source = "pass  # no more tests"
    path = tmp_path / "mine.ipynb"
    nbformat.write(learner, path)

    kept = tmp_path / "kept"
    assert cli.main(["grade", str(path), "--json", "--keep", str(kept)]) == 1  # not full marks
    result = json.loads(capsys.readouterr().out)
    _check_the_learners_graded_copy(Path(result["kept"]), kept)
    points = {e["grade_id"]: (e["points"], e["max_points"]) for e in result["exercises"]}
    assert points == {
        "test-bytes-per-parameter": (2, 2),
        "test-manual-backward": (0, 3),  # graded with the original test, not the learner's `pass`
        "test-accumulate-gradients": (0, 3),
    }
    assert result["edited_test_cells"] == ["test-manual-backward"]
    failures = {e["grade_id"]: e["failure"] for e in result["exercises"]}
    assert failures["test-bytes-per-parameter"] is None
    assert "NotImplementedError" in failures["test-accumulate-gradients"]
    raisers = {e["grade_id"]: e["raised_in"] for e in result["exercises"]}
    assert raisers["test-accumulate-gradients"] == "accumulate_gradients"  # the learner's stub
    assert raisers["test-bytes-per-parameter"] is None

    # One exercise at a time (issue 24 §4): the points nbgrader gave it in the whole notebook
    numbers = range(1, len(result["exercises"]) + 1)
    each = grading.grade_exercises([(path, number) for number in numbers])
    for number, whole, graded in zip(numbers, result["exercises"], each, strict=True):
        alone = graded.exercises
        assert [(e.grade_id, e.points, e.max_points) for e in alone] == [
            (whole["grade_id"], whole["points"], whole["max_points"])
        ], f"exercise {number} alone"
        assert (alone[0].failure is None) == (whole["failure"] is None)
        assert alone[0].raised_in == whole["raised_in"]


@pytest.mark.slow
def test_a_new_gradebook_gets_the_schema_version_nbgrader_would_give_it(monkeypatch):
    """nbgrader_main reads the alembic head in process; nbgrader asks a new `alembic heads`."""
    import os
    import sys

    from nbgrader.api import get_alembic_version

    from distlab.grading.nbgrader_main import alembic_head, split_commands

    bin_dir = os.path.dirname(sys.executable)  # where `alembic` is installed
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    assert alembic_head() == get_alembic_version()
    assert split_commands(["a", "1", "--then", "b", "--then"]) == [["a", "1"], ["b"]]


def test_find_a_notebook_by_path_from_course_or_by_name(tmp_path, monkeypatch):
    """`distlab grade` works from the terminal JupyterLab opens in course/ (issue 11)."""
    monkeypatch.chdir(ROOT / "course")
    readme_path = f"course/{ASSIGNMENT}/{ASSIGNMENT}.ipynb"
    for given in (
        readme_path,
        f"{ASSIGNMENT}/{ASSIGNMENT}.ipynb",
        ASSIGNMENT,
        "01",
        ASSIGNMENT + ".ipynb",
    ):
        assert grading.find_notebook(given).resolve() == RELEASED.resolve(), given
    monkeypatch.chdir(tmp_path)
    assert grading.find_notebook(readme_path).resolve() == RELEASED.resolve()
    mine = tmp_path / f"{ASSIGNMENT}.ipynb"
    mine.write_bytes(RELEASED.read_bytes())
    assert grading.find_notebook(mine.name).resolve() == mine  # a file here wins over the course's
    with pytest.raises(FileNotFoundError, match=r"no such notebook: 99 .*00-launching, 01-memory"):
        grading.find_notebook("99")


# What IPython (ipykernel 7) writes for an error raised two calls deep in notebook code,
# and for a RankError from a function defined in a cell.
NESTED_ERROR = {
    "output_type": "error",
    "ename": "NotImplementedError",
    "evalue": "",
    "traceback": [
        "\x1b[31m----\x1b[39m",
        "\x1b[31mNotImplementedError\x1b[39m   Traceback (most recent call last)",
        "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[7]\x1b[39m\x1b[32m, line 2\x1b[39m\n----> 2 ddp = BucketDDP(model)\n",
        "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[5]\x1b[39m\x1b[32m, line 9\x1b[39m, in \x1b[36mBucketDDP.__init__\x1b[39m\x1b[34m(self, model)\x1b[39m\n---> 9 self.buckets = assign_buckets(model)\n",
        "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[4]\x1b[39m\x1b[32m, line 3\x1b[39m, in \x1b[36massign_buckets\x1b[39m\x1b[34m(params)\x1b[39m\n---> 3 raise NotImplementedError\n",
        "\x1b[31mNotImplementedError\x1b[39m: ",
    ],
}
RANK_ERROR = {
    "output_type": "error",
    "ename": "RankError",
    "evalue": "rank 1 failed with ValueError; every rank was stopped.\n"
    "--- traceback from rank 1 ---\nTraceback (most recent call last):\n"
    '  File "/work/distlab/launch.py", line 183, in _run_job\n    result = fn(rank, world_size)\n'
    '  File "/tmp/ipykernel_15174/2560317363.py", line 4, in two_level\n'
    '  File "/work/distlab/collectives/api.py", line 40, in all_reduce\nValueError: boom',
    "traceback": [
        "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[3]\x1b[39m\x1b[32m, line 6\x1b[39m\n",
        "\x1b[36mFile \x1b[39m\x1b[32m/work/distlab/launch.py:383\x1b[39m, in \x1b[36mrun\x1b[39m\x1b[34m(fn)\x1b[39m\n",
    ],
}


def test_the_report_names_the_function_that_raised():
    assert grading.raised_in([NESTED_ERROR]) == "assign_buckets"
    assert grading.raised_in([RANK_ERROR]) == "two_level"
    in_the_test = {**NESTED_ERROR, "traceback": NESTED_ERROR["traceback"][:3]}
    assert grading.raised_in([in_the_test]) is None  # the test cell's own assertion
    exercise = grading.ExerciseScore(
        "b", "DDP hooks", 0, 4, "NotImplementedError", f"{ASSIGNMENT}#backprop", "assign_buckets"
    )
    report = grading.format_report(grading.NotebookGrade(ASSIGNMENT, ASSIGNMENT, [exercise]))
    assert re.search(r"NotImplementedError\n\s+raised in assign_buckets\(\)", report)


def test_card_counts_are_singular_or_plural(monkeypatch):
    monkeypatch.setattr(
        grading_report, "flashcard_suggestions", lambda grade: [("a#b", 1), ("a#c", 2)]
    )
    report = grading.format_report(grading.NotebookGrade(ASSIGNMENT, ASSIGNMENT, []))
    assert "a#b   (1 card)" in report and "a#c   (2 cards)" in report


def _graded_cell(source: str, outputs: list) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "t", "points": 2, "solution": False}
    cell.outputs = outputs
    return cell


def test_a_kernel_death_outside_a_test_cell_is_a_note_of_the_report():
    from distlab.grading.execute import KERNEL_DIED, error_output

    died = [error_output("DeadKernelError", KERNEL_DIED)]
    cells = [nbformat.v4.new_code_cell("os._exit(1)"), _graded_cell("assert f()", died)]
    cells[0].outputs = died
    notes = kernel_deaths(nbformat.v4.new_notebook(cells=cells))
    expected = (
        "the kernel died while running cell 1 (not a test cell); "
        "the cells after it ran in a fresh kernel"
    )
    assert notes == [expected]  # the test cell's own death is reported on its exercise
    report = grading.format_report(
        grading.NotebookGrade(ASSIGNMENT, ASSIGNMENT, [], problems=notes)
    )
    assert "note: the kernel died while running cell 1 (not a test cell)" in report


def test_after_too_many_deaths_the_cells_left_score_nothing():
    """A test cell that never ran has no error output: it must not pass by default."""
    from nbgrader.utils import determine_grade

    from distlab.grading.execute import GuardedExecute

    executor = GuardedExecute()
    executor._dead = [0, 0, 0]
    cells = [nbformat.v4.new_code_cell("os._exit(1)"), _graded_cell("assert True", [])]
    assert determine_grade(cells[1]) == (2, 2)  # what nbgrader would give it unrun
    executor._give_up(nbformat.v4.new_notebook(cells=cells), start=1)
    assert determine_grade(cells[1]) == (0, 2)
    assert cells[1].outputs[0].evalue == "not run: the kernel died 3 times before this cell"


def test_a_test_cell_that_writes_to_stderr_loses_its_points_and_says_why():
    """nbgrader scores a test cell 0 when it writes to stderr; both grading paths say so."""
    import nbformat as nbf

    from distlab.grading.execute import scores
    from distlab.grading.exercise import _score

    outputs = [{"output_type": "stream", "name": "stderr", "text": "UserWarning: something\n"}]
    assert failure(outputs).startswith("the test cell wrote to stderr")
    cell = nbf.v4.new_code_cell("pass")
    cell.metadata = {"nbgrader": {"grade": True, "grade_id": "t", "points": 2, "locked": True}}
    cell.outputs = [nbf.from_dict(o) for o in outputs]
    executed = nbf.v4.new_notebook(cells=[cell])
    score = _score(cell, {"t": cell}, scores(executed))
    assert (score.points, score.max_points) == (0.0, 2.0) and "UserWarning" in score.failure
    cell.outputs = []
    assert _score(cell, {"t": cell}, scores(executed)).points == 2.0


def test_the_first_cells_leading_imports_only_are_sent_early():
    from distlab.grading.kernel import early_imports
    from distlab.grading.slicing import leading_imports

    cell = "%matplotlib inline\nimport os\nos.environ['X'] = '1'  # read when torch loads\nimport torch"
    assert (
        leading_imports(cell) == "get_ipython().run_line_magic('matplotlib', 'inline')\nimport os"
    )
    assert leading_imports("x = 1\nimport torch") == leading_imports("def f(:") == ""
    test_first = _graded_cell("import torch\nassert torch", [])
    assert early_imports(nbformat.v4.new_notebook(cells=[test_first])) == ""
    launching = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in ("import distlab", "distlab.run(f, 2)")]
    )
    assert "distlab.launch.prestart()" in early_imports(launching)
    launching.cells[1].source = "print('no launch')"
    assert "prestart" not in early_imports(launching)


@pytest.mark.timeout(600)
def test_early_imports_run_first_and_bind_nothing_in_the_notebook(tmp_path):
    """The kernel started before nbgrader loads has imported the first cell's modules, but
    the notebook's namespace, history and execution count are as if it had not."""
    from distlab.grading import execute
    from distlab.grading.kernel import start_kernel

    first = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import colorsys as probe\nearly = 1\nimport wave")]
    )
    checks = [
        "import sys\nassert 'colorsys' in sys.modules and 'wave' not in sys.modules",
        "assert not {'probe', 'colorsys', 'early'} & set(globals()) and _ == '', sorted(globals())",
        "assert len(In) == 4, In  # In[0] is empty, In[3] is this cell: nothing else ran",
    ]
    run = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in checks])
    run.cells.append(_graded_cell("assert True", []))
    given, done, scores = tmp_path / "in.ipynb", tmp_path / "out.ipynb", tmp_path / "s.json"
    nbformat.write(run, given)
    kernel = start_kernel(first, str(tmp_path))
    execute.main([str(given), str(done), "--timeout", "300", "--scores", str(scores)], kernel)
    executed = nbformat.read(done, as_version=4)
    errors = [o for c in executed.cells for o in c.outputs if o.output_type == "error"]
    assert errors == [] and [c.execution_count for c in executed.cells] == [1, 2, 3, 4]
    assert json.loads(scores.read_text()) == {"t": 2.0}
    assert not kernel.manager.has_kernel, "the early kernel is shut down"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_exercise_child_never_loads_the_slow_modules_grading_skips(tmp_path):
    """The child of ``distlab grade --exercise`` loads distlab.grading before nbformat, so
    rfc3987_syntax (about 2.5 s of CPU) stays out of it, as out of every grading process."""
    import subprocess

    from distlab.grading.exercise import child_command
    from distlab.grading.kernel import RUN_NOTEBOOK, RUN_SCORES, RUN_WORK
    from distlab.grading.run import UNUSED_SLOW_MODULES, nbgrader_env

    run = nbformat.v4.new_notebook(cells=[_graded_cell("assert 1 + 1 == 2", [])])
    (tmp_path / RUN_WORK).mkdir()
    nbformat.write(run, tmp_path / RUN_NOTEBOOK)
    points = tmp_path / RUN_SCORES
    python, flag, module, *args = child_command([tmp_path], 300)
    assert flag == "-m", "the child runs as a module of distlab.grading"
    probe = (  # run the child as -m would, then list the slow modules it really loaded
        "import json, runpy, sys\n"
        f"sys.argv = [{module!r}, *{args!r}]\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
        f"print(json.dumps([m for m in {UNUSED_SLOW_MODULES!r} if sys.modules.get(m)]))\n"
    )
    done_probe = subprocess.run(
        [python, "-c", probe], cwd=tmp_path, env=nbgrader_env(), capture_output=True,
        text=True, check=True, timeout=500,
    )  # fmt: skip
    assert json.loads(done_probe.stdout.splitlines()[-1]) == []
    assert json.loads(points.read_text()) == {"t": 2.0}


TRANSPORT = "from ipykernel.kernelapp import IPKernelApp\nprint(IPKernelApp.instance().transport)"


@pytest.mark.timeout(600)
def test_the_graders_kernels_listen_on_sockets_of_their_own(tmp_path, monkeypatch):
    """The Execute step's kernel and the mutation check's kernel use Unix sockets in the
    runtime folder, not TCP ports another process can take between the port's choice and
    the kernel's bind (CI lost a mutation check to "Address already in use"); the socket
    files go with the kernel."""
    from distlab.grading import execute
    from distlab.grading.mutants import Kernel

    runtime = Path(tempfile.mkdtemp(prefix="rt-"))  # short: a socket's path has ~100 bytes
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    run = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(TRANSPORT)])
    run.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    given, done = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(run, given)
    execute.main([str(given), str(done), "--timeout", "300"])
    executed = nbformat.read(done, as_version=4)
    assert [o.get("text") for o in executed.cells[0].outputs] == ["ipc\n"]
    with Kernel(str(tmp_path)) as kernel:
        assert [o.get("text") for o in kernel.run(TRANSPORT)] == ["ipc\n"]
        assert any(p.name.endswith("-ipc-1") for p in runtime.iterdir()), list(runtime.iterdir())
    assert not [p for p in runtime.iterdir() if "-ipc-" in p.name], list(runtime.iterdir())
    shutil.rmtree(runtime)


def test_a_runtime_folder_too_long_for_a_socket_falls_back_to_the_temporary_one(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from distlab.grading.sockets import MAX_SOCKET_PATH, use_private_sockets

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(deep))
    short = Path(tempfile.mkdtemp(prefix="t-", dir="/tmp"))  # tmp_path may be too long itself
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    km = SimpleNamespace(transport="tcp", ip="127.0.0.1")
    use_private_sockets(km)
    assert km.transport == "ipc" and Path(km.ip).parent == short
    assert len(km.ip) + 3 <= MAX_SOCKET_PATH and not deep.exists()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    km = SimpleNamespace(transport="tcp", ip="127.0.0.1")
    use_private_sockets(km)
    assert (km.transport, km.ip) == ("tcp", "127.0.0.1"), "no short folder: TCP as before"
    shutil.rmtree(short)
