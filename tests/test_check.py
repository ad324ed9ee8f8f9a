"""``distlab.check(...)`` (issue 42): one exercise's tests, hidden ones included, on what the
notebook's kernel holds now, scored as ``distlab grade --exercise`` scores them.

The fast tests run the check in an in-process IPython shell on a small course written here
(a pure-Python exercise that withholds ``distlab.sim.busbw``): points, hidden tests,
shortcuts by name and by a captured reference, nbgrader's stderr rule, the timeout, the
learner's names left alone, which notebook and which exercise, the record. One test runs it
in a real kernel as JupyterLab does (the notebook's file in ``JPY_SESSION_NAME``, the cell's
id in the request's metadata) for ``distlab.check()`` with no argument.

The check's points against ``distlab grade --exercise``'s, for the solution, the released
stub and every mutant of one exercise per compared notebook, are in
``tests/test_grading_mutants.py``: the check runs in the mutation suite's kernel, after
each variant, so the comparison pays for no kernel and no prefix cells of its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

from distlab.core.course import find_course_root, source_notebook
from distlab.grading.cells import autograde_points
from distlab.grading.exercise import choose_tests
from distlab.grading.record import CHECKED, read_records

ROOT = find_course_root()

# ------------------------------------------------------------- a small course ---
SETUP = "from distlab import sim\nfrom distlab.withheld import expect, withheld"
SOLUTION = '''def bus_bandwidth(n, n_bytes, seconds):
    """busbw of an all-reduce: algbw * 2 (n - 1) / n."""
    ### BEGIN SOLUTION
    return n_bytes / seconds * 2 * (n - 1) / n
    ### END SOLUTION'''
TEST = """want = sim.busbw("all_reduce", 8, 10**9, 1e-2)
with withheld(sim.busbw, exercise="bus bandwidth"):
    got = bus_bandwidth(8, 10**9, 1e-2)
expect(abs(got - want) <= 1e-9 * want, "busbw on 8 ranks", got, want)
print("visible test passed")
### BEGIN HIDDEN TESTS
want = sim.busbw("all_reduce", 3, 10**6, 1e-3)
with withheld(sim.busbw, exercise="bus bandwidth"):
    got = bus_bandwidth(3, 10**6, 1e-3)
expect(abs(got - want) <= 1e-9 * want, "busbw on 3 ranks (hidden)", got, want)
### END HIDDEN TESTS"""
SECOND = """def second():
    ### BEGIN SOLUTION
    return 2
    ### END SOLUTION"""
SECOND_TEST = 'assert second() == 2, "second() should return 2"'


def _cell(kind, source, cell_id, **nbgrader):
    maker = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
    cell = maker(source, id=cell_id)
    if nbgrader:
        cell.metadata["nbgrader"] = {"schema_version": 3, **nbgrader}
    return cell


def toy_notebook(solution=SOLUTION, second=SECOND) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    test_meta = {"grade": True, "solution": False, "locked": True}
    nb.cells = [
        _cell("code", SETUP, "setup"),
        _cell("code", solution, "sol-1", grade=False, solution=True, grade_id="bus-bandwidth"),
        _cell("code", TEST, "test-1", grade_id="test-bus-bandwidth", points=2, **test_meta),
        _cell("markdown", "## Second", "md-2"),
        _cell("code", second, "sol-2", grade=False, solution=True, grade_id="second"),
        _cell("code", SECOND_TEST, "test-2", grade_id="test-second", points=1, **test_meta),
        _cell("code", "# the learner's scratch cell", "scratch"),
    ]
    nb.cells[2].metadata["distlab"] = {"exercise": "Bus bandwidth"}
    nb.cells[5].metadata["distlab"] = {"exercise": "Second"}
    return nb


@pytest.fixture(autouse=True)
def _data_folder(tmp_path, monkeypatch):
    from distlab.grading.record import DATA_ENV_VAR

    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "data"))


@pytest.fixture
def course(tmp_path):
    """A course with one notebook, ``00-toy``, and its released copy."""
    root = tmp_path / "course-root"
    (root / "solutions" / "00-toy").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text("c = get_config()\nc.Execute.timeout = 30\n")
    nbformat.write(toy_notebook(), root / "solutions" / "00-toy" / "00-toy.ipynb")
    return root


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def run_cells(shell, *sources):
    for source in sources:
        assert shell.run_cell(source).success, source


def check(*args, **kwargs):
    from distlab.grading.check import check as the_check

    return the_check(*args, **kwargs)


# ------------------------------------------------------------------ fast ---
def test_the_solution_earns_full_points_and_the_check_is_recorded_as_a_check(shell, course):
    run_cells(shell, SETUP, SOLUTION)
    started = time.perf_counter()
    result = check("bus-bandwidth", notebook="00", root=course)
    assert time.perf_counter() - started < 2.0  # the bar; this test cell is pure Python
    assert (result.points, result.max_points, result.number) == (2.0, 2.0, 1)
    report = repr(result)
    assert "00-toy, exercise 1 (Bus bandwidth): 2 / 2 points" in report
    assert "not your grade" in report and "`distlab grade 00`" in report
    assert "visible test passed" not in report  # a grade's report shows no test output either
    recorded = read_records()["00-toy"][CHECKED]["test-bus-bandwidth"]
    assert (recorded["points"], recorded["how"]) == (2.0, "check")
    assert "test-bus-bandwidth" not in read_records()["00-toy"]["graded"]


def test_the_hidden_tests_run_too(shell, course):
    visible_only = "def bus_bandwidth(n, n_bytes, seconds):\n    return 1.75e11 if n == 8 else 0.0"
    run_cells(shell, SETUP, visible_only)
    result = check(1, notebook="00-toy", root=course, record=False)
    assert result.points == 0
    assert "busbw on 3 ranks (hidden)" in result.grade.exercises[0].failure


@pytest.mark.parametrize(
    "shortcut, says",
    [
        ("def bus_bandwidth(n, b, s):\n    return sim.busbw('all_reduce', n, b, s)",
         "your function called distlab.sim.bandwidth.busbw"),
        ("def bus_bandwidth(n, b, s, _ref=sim.busbw):\n    return _ref('all_reduce', n, b, s)",
         "reached without its name (a default argument"),
        (("import functools\nbus_bandwidth = lambda n, b, s, f=functools.partial(sim.busbw, "
          "'all_reduce'): f(n, b, s)"), "reached without its name"),
    ],
    ids=["by-name", "default-argument", "partial"],
)  # fmt: skip
def test_a_shortcut_is_caught_as_distlab_grade_catches_it(shell, course, shortcut, says):
    run_cells(shell, SETUP, shortcut)
    result = check(1, notebook="00", root=course, record=False)
    assert result.points == 0
    failure = result.grade.exercises[0].failure
    assert failure.startswith("ExerciseShortcut: exercise 'bus bandwidth' asks you to write")
    assert says in failure
    from distlab import sim

    assert shell.user_ns["sim"].busbw is sim.busbw  # put back after the test


def test_a_test_that_writes_to_stderr_scores_zero_as_in_nbgrader(shell, course):
    noisy = "import sys\ndef second():\n    print('debug', file=sys.stderr)\n    return 2"
    run_cells(shell, SETUP, noisy)
    result = check("second", notebook="00", root=course, record=False)
    assert result.points == 0
    assert "wrote to stderr" in result.grade.exercises[0].failure


def test_the_learner_names_are_left_alone(shell, course):
    run_cells(shell, SETUP, SOLUTION, "got = 'mine'\nwant = 'mine too'")
    assert check(1, notebook="00", root=course, record=False).points == 2
    assert (shell.user_ns["got"], shell.user_ns["want"]) == ("mine", "mine too")


def test_a_name_the_kernel_lacks_says_to_run_the_cell_that_defines_it(shell, course):
    run_cells(shell, SETUP)
    result = check(1, notebook="00", root=course, record=False)
    failure = result.grade.exercises[0].failure
    assert failure.startswith("NameError: name 'bus_bandwidth' is not defined")
    assert "if a cell above defines it, run that cell" in failure


def test_a_test_past_the_timeout_is_reported_as_distlab_grade_reports_it(shell, course):
    run_cells(shell, SETUP, "import time\ndef second():\n    while True:\n        time.sleep(0.05)")
    result = check("second", notebook="00", root=course, record=False, timeout=1)
    assert result.points == 0
    assert result.grade.exercises[0].failure.startswith("TimeoutError: timed out after 1 s")


def test_a_test_that_catches_the_first_interrupt_is_stopped_by_the_next(shell, course):
    """The limit interrupts again every second until the cell ends: a cell that swallows
    one ``KeyboardInterrupt`` (a bare ``except:``) cannot run on past it."""
    swallows_one = ("import time\ndef second():\n    try:\n        while True:\n"
                    "            time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass\n"
                    "    while True:\n        time.sleep(0.05)")  # fmt: skip
    run_cells(shell, SETUP, swallows_one)
    started = time.perf_counter()
    result = check("second", notebook="00", root=course, record=False, timeout=1)
    assert result.grade.exercises[0].failure.startswith("TimeoutError: timed out after 1 s")
    assert time.perf_counter() - started < 60  # two interrupts a second apart, not pytest's 300 s


@pytest.mark.timeout(60)
def test_the_limit_holds_where_the_process_ignores_ctrl_c(shell, course):
    """A pytest worker was twice found with SIGINT ignored, and the 1 s limit then never
    fired: within the check SIGINT raises, as in a kernel running a cell, and the process's
    own setting is back after it."""
    import signal

    run_cells(shell, SETUP, "import time\ndef second():\n    while True:\n        time.sleep(0.05)")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = check("second", notebook="00", root=course, record=False, timeout=1)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.grade.exercises[0].failure.startswith("TimeoutError: timed out after 1 s")


def test_the_notebook_comes_from_the_kernels_file_or_the_exercise_name(shell, course, tmp_path):
    run_cells(shell, SETUP, SOLUTION)
    learner = tmp_path / "work" / "my copy.ipynb"
    learner.parent.mkdir()
    nbformat.write(toy_notebook(), learner)
    shell.user_ns["__session__"] = str(learner)  # what ipykernel sets under JupyterLab
    result = check(1, root=course, record=False)
    assert (result.grade.assignment, result.grade.path) == ("00-toy", str(learner))
    del shell.user_ns["__session__"]
    assert check("bus-bandwidth", root=course, record=False).grade.assignment == "00-toy"
    with pytest.raises(ValueError, match="does not say which notebook"):
        check(1, root=course, record=False)
    stranger = tmp_path / "work" / "other.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), stranger)
    with pytest.raises(ValueError, match="other.ipynb is not a notebook of the course"):
        check(1, notebook=stranger, root=course, record=False)
    with pytest.raises(ValueError, match="no single exercise matches 'nope'"):
        check("nope", notebook="00", root=course, record=False)


def test_check_without_an_argument_takes_the_exercise_above_the_cell(shell, course, tmp_path):
    learner = tmp_path / "00-toy.ipynb"
    nbformat.write(toy_notebook(), learner)
    run_cells(shell, SETUP, SOLUTION, SECOND)
    shell.user_ns["__session__"] = str(learner)

    class Kernel:  # ipykernel's get_parent(): the request, with JupyterLab's cell id
        cell_id = None

        def get_parent(self):
            return {"metadata": {"cellId": self.cell_id}}

    shell.kernel = Kernel()
    try:
        for cell_id, exercise in [("test-1", "test-bus-bandwidth"), ("md-2", "test-bus-bandwidth"),
                                  ("sol-2", "test-bus-bandwidth"), ("test-2", "test-second"),
                                  ("scratch", "test-second")]:  # fmt: skip
            shell.kernel.cell_id = cell_id
            assert check(root=course, record=False).grade.exercises[0].grade_id == exercise
        shell.kernel.cell_id = "a-new-cell"
        with pytest.raises(ValueError, match=r"not in the saved notebook .* save the notebook"):
            check(root=course, record=False)
        shell.kernel.cell_id = "setup"
        with pytest.raises(ValueError, match="no exercise above this cell"):
            check(root=course, record=False)
    finally:
        del shell.kernel


def test_outside_a_kernel_it_says_to_use_distlab_grade():
    from IPython.core.interactiveshell import InteractiveShell

    assert not InteractiveShell.initialized()
    with pytest.raises(RuntimeError, match="distlab grade NN --exercise K"):
        check(1, notebook="00")


def test_an_exercise_is_named_by_its_test_id_with_or_without_test_or_by_its_title():
    source = nbformat.read(source_notebook(ROOT, "02-collectives"), as_version=4)
    assert choose_tests(source, "ring-all-reduce") == ["test-ring-all-reduce"]
    assert choose_tests(source, "test-ring-all-gather") == ["test-ring-all-gather"]
    assert choose_tests(source, "Ring reduce") == ["test-ring-reduce-scatter"]
    assert choose_tests(source, "ring_all_gather") == ["test-ring-all-gather"]


OUTPUTS = {
    "nothing": [],
    "stdout": [{"output_type": "stream", "name": "stdout", "text": "ok\n"}],
    "stderr": [{"output_type": "stream", "name": "stderr", "text": "warn\n"}],
    "error": [{"output_type": "error", "ename": "E", "evalue": "", "traceback": []}],
    "partial": [{"output_type": "execute_result", "data": {"text/plain": "1.5"}, "metadata": {},
                 "execution_count": 1}],
    "text result": [{"output_type": "execute_result", "data": {"text/plain": "'done'"},
                     "metadata": {}, "execution_count": 1}],
    "negative": [{"output_type": "execute_result", "data": {"text/plain": "-1"}, "metadata": {},
                  "execution_count": 1}],
}  # fmt: skip


@pytest.mark.slow  # importing nbgrader takes seconds
@pytest.mark.parametrize("case", OUTPUTS)
def test_the_points_rule_is_nbgraders(case):
    from nbgrader.utils import determine_grade

    cell = nbformat.v4.new_code_cell("x", outputs=[nbformat.from_dict(o) for o in OUTPUTS[case]])
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "points": 2, "grade_id": "t"}
    assert autograde_points(OUTPUTS[case], 2.0) == determine_grade(cell)[0]


# --------------------------------------------------- in a real kernel ---
MESSAGE_S = 180  # one kernel message on a loaded 2-core machine (the first imports torch)


class LabKernel:
    """A real kernel, sent requests as JupyterLab sends them: with the cell's id."""

    def __init__(self, cwd: Path, notebook: Path, **env: str):
        from jupyter_client import KernelManager

        self.manager = KernelManager(kernel_name="python3")
        env = {**os.environ, **env, "JPY_SESSION_NAME": str(notebook)}  # as jupyter_server does
        self.manager.start_kernel(cwd=str(cwd), env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=MESSAGE_S)

    def run(self, code: str, cell_id: str) -> tuple[str, dict | None]:
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}  # fmt: skip
        message = self.client.session.msg("execute_request", content, metadata={"cellId": cell_id})
        self.client.shell_channel.send(message)
        msg_id, text, error = message["header"]["msg_id"], [], None
        while True:
            reply = self.client.get_iopub_msg(timeout=MESSAGE_S)
            if reply["parent_header"].get("msg_id") != msg_id:
                continue
            kind, body = reply["msg_type"], reply["content"]
            if kind == "stream":
                text.append(body["text"])
            elif kind in ("execute_result", "display_data"):
                text.append(body["data"].get("text/plain", ""))
            elif kind == "error":
                error = body
            elif kind == "status" and body["execution_state"] == "idle":
                return "".join(text), error

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.mark.slow
def test_in_a_real_kernel_check_finds_the_notebook_and_the_exercise_above(course, tmp_path):
    learner = tmp_path / "00-toy.ipynb"
    nb = toy_notebook()
    nb.cells.insert(3, _cell("code", "import distlab\ndistlab.check()", "check-here"))
    nbformat.write(nb, learner)
    kernel = LabKernel(tmp_path, learner, DISTLAB_COURSE_ROOT=str(course))
    try:
        for cell in [SETUP, SOLUTION]:
            assert kernel.run(cell, "x")[1] is None
        shown, error = kernel.run("import distlab\ndistlab.check()", "check-here")
        assert error is None, error
        assert "00-toy, exercise 1 (Bus bandwidth): 2 / 2 points" in shown
        kernel.run(
            "def bus_bandwidth(n, b, s, _f=sim.busbw):\n    return _f('all_reduce', n, b, s)",
            "sol-1",
        )
        shown, _ = kernel.run("distlab.check()", "check-here")
        assert "0 / 2 points" in shown and "reached without its name" in shown
    finally:
        kernel.close()
    checked = read_records()["00-toy"][CHECKED]["test-bus-bandwidth"]
    assert (checked["points"], checked["path"]) == (0.0, str(learner))
