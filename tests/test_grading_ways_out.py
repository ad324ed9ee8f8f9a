"""`distlab grade` ends every process the graded notebook started, on every way out.

Each test builds a throw-away course of one small notebook in tmp_path, grades it with the
real command in a subprocess (its TMPDIR inside tmp_path), and then looks in /proc for the
`sleep` processes the notebook started (each test's own duration marks them as its own).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")

ASSIGNMENT = "90-ways-out"
CONFIG = """c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "ways-out"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
"""


def _test_cell(grade_id: str, source: str):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "grade": True,
        "grade_id": grade_id,
        "locked": True,
        "points": 1,
        "schema_version": 3,
        "solution": False,
        "task": False,
    }
    return cell


def _course(tmp_path: Path, cells) -> Path:
    """A course with one notebook; returns the learner's copy (the source itself)."""
    root = tmp_path / "course-root"
    (root / "solutions" / ASSIGNMENT).mkdir(parents=True)
    (root / "nbgrader_config.py").write_text(CONFIG)
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(notebook, root / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    return root


def _mark() -> str:
    """A `sleep` duration that only this test uses (an hour and a unique fraction)."""
    return f"3600.{uuid.uuid4().int % 10**9:09d}"


def _spawn(mark: str) -> str:
    return (
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{mark}'])  # in the kernel's own process group\n"
        f"subprocess.Popen(['sleep', '{mark}'], start_new_session=True)  # escapes it\n"
    )


def _alive_with(mark: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or mark.encode() not in (entry / "cmdline").read_bytes():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue  # it ended while we looked
    return found


def _alive_in(folder: Path) -> list[int]:
    """Live processes whose working folder is inside ``folder`` (nbgrader, the kernel)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                found.append(int(entry.name))
        except OSError:
            continue  # it ended while we looked, or it is not ours
    return found


def _env(tmp_path: Path, **extra) -> dict[str, str]:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    env.pop("DISTLAB_GRADE_TIMEOUT", None)
    return {**env, **extra}


def _grade_command(root: Path, notebook: Path) -> list[str]:
    return [sys.executable, "-m", "distlab.cli", "grade", str(notebook), "--course-root", str(root)]


def _assert_nothing_left(tmp_path: Path, mark: str) -> None:
    left = _alive_with(mark)
    for pid in left:  # do not leave them to the next test either
        os.kill(pid, signal.SIGKILL)
    assert left == [], "processes the notebook started outlived the grader"
    assert _alive_in(tmp_path / "tmp") == [], "nbgrader or its kernel outlived the grader"
    assert list((tmp_path / "tmp").iterdir()) == [], "temporary folders were left"
    assert not (tmp_path / "rt").exists() or list((tmp_path / "rt").iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_escaped_processes_a_dead_kernel_a_timeout_and_a_deleted_test(tmp_path):
    mark = _mark()
    runs = tmp_path / "loop-runs.txt"  # "run " each time the endless loop starts
    cells = [
        _test_cell("test-spawn", _spawn(mark)),
        _test_cell("test-loop", f"open({str(runs)!r}, 'a').write('run ')\nwhile True:\n    pass"),
        _test_cell("test-exit", "import os\nos._exit(1)"),
        _test_cell("test-after", "assert 1 + 1 == 2"),
        _test_cell("test-deleted", "assert True"),
    ]
    root = _course(tmp_path, cells)
    learner = nbformat.read(root / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    learner.cells = learner.cells[:-1]  # the learner deleted the last test cell
    path = tmp_path / "mine.ipynb"
    nbformat.write(learner, path)

    # stdout is a pipe: a process left holding it would block this call for an hour
    done = subprocess.run(
        _grade_command(root, path), env=_env(tmp_path, DISTLAB_GRADE_TIMEOUT="5"), check=False,
        capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    report = done.stdout
    assert done.returncode == 1, done.stdout + done.stderr  # below full marks
    assert "Traceback" not in done.stderr + report, done.stderr
    assert f"{ASSIGNMENT}: 2 / 5 points" in report
    assert f"graded {path.resolve()} (modified " in report
    assert re.search(r"test-spawn\s+1/1\s+passed", report)
    assert re.search(r"test-exit\s+0/1\s+FAILED\n\s+kernel died while running test-exit", report)
    assert re.search(r"test-loop\s+0/1\s+FAILED\n\s+TimeoutError: timed out after 5 s", report)
    assert runs.read_text() == "run ", "a cell that timed out is not replayed after a death"
    assert re.search(r"test-after\s+1/1\s+passed", report), "graded in a fresh kernel"
    assert re.search(r"test-deleted\s+0/1\s+FAILED\n\s+this test cell is missing", report)
    _assert_nothing_left(tmp_path, mark)


def _start_and_wait_for_the_notebook(tmp_path: Path, mark: str) -> subprocess.Popen:
    """Grade a notebook that starts two `sleep`s and then waits; return once they run."""
    root = _course(
        tmp_path, [_test_cell("test-wait", _spawn(mark) + "import time\ntime.sleep(3600)")]
    )
    notebook = root / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    grader = subprocess.Popen(
        _grade_command(root, notebook), env=_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,  # like a terminal's job
    )  # fmt: skip
    while len(_alive_with(mark)) < 2:  # bounded by the work: the notebook reaching its cell
        assert grader.poll() is None, grader.communicate()
        time.sleep(0.5)
    return grader


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a guard for a grader that never reaches the cell; see the bound below
@pytest.mark.parametrize(
    ("signum", "exit_code", "said"),
    [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl+C (SIGINT)")],
)
def test_an_interrupted_grade_ends_everything_it_started(tmp_path, signum, exit_code, said):
    mark = _mark()
    started = time.monotonic()
    grader = _start_and_wait_for_the_notebook(tmp_path, mark)
    os.killpg(grader.pid, signum)  # what a terminal does: the whole foreground job
    # Ending everything is less work than starting nbgrader, the kernel and the notebook:
    # twice that start (at least 60 s) bounds it, however loaded the machine.
    _, err = grader.communicate(timeout=max(60, 2 * (time.monotonic() - started)))
    assert grader.returncode == exit_code, err
    assert err.strip().splitlines()[-1].startswith(f"distlab grade: stopped by {said}; "), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    _assert_nothing_left(tmp_path, mark)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a guard for a grader that never reaches the cell; see the bound below
@pytest.mark.parametrize("whom", ["process", "group"])
def test_a_killed_grader_leaves_nothing_running(tmp_path, whom):
    """Issue 40: SIGKILL runs no clean-up code, and nbgrader's child, in a session of its
    own, went on grading as an orphan for half an hour. The watchdog ends it, the kernel,
    the escaped processes and the temporary folder."""
    mark = _mark()
    started = time.monotonic()
    grader = _start_and_wait_for_the_notebook(tmp_path, mark)
    spent = time.monotonic() - started
    if whom == "group":
        os.killpg(grader.pid, signal.SIGKILL)  # kill -9 of the terminal's whole job
    else:
        os.kill(grader.pid, signal.SIGKILL)  # the out-of-memory killer: the grader alone
    grader.communicate()
    assert grader.returncode == -signal.SIGKILL
    # The watchdog acts within milliseconds; twice the grader's start (at least 60 s) is
    # headroom for a loaded machine, as above.
    deadline = time.monotonic() + max(60, 2 * spent)
    while _alive_with(mark) or _alive_in(tmp_path / "tmp") or list((tmp_path / "tmp").iterdir()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    _assert_nothing_left(tmp_path, mark)


def test_the_next_grade_cleans_up_after_a_grader_whose_watchdog_died_too(tmp_path, monkeypatch):
    """A grader and its watchdog both killed (``kill -9 -1``): the next grade's
    :func:`clean_abandoned_runs` ends the dead run's tagged processes and removes its
    folder, and leaves a live grader's folder alone."""
    import tempfile

    from distlab.core.processes import started_at
    from distlab.grading.run import OWNER_FILE, SCRATCH_PREFIX, TOKEN_VAR, clean_abandoned_runs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no process now
    token, mark = uuid.uuid4().hex, _mark()
    left = subprocess.Popen(
        ["sleep", mark], env={**os.environ, TOKEN_VAR: token}, start_new_session=True
    )
    abandoned = tmp_path / (SCRATCH_PREFIX + "dead")
    abandoned.mkdir()
    (abandoned / OWNER_FILE).write_text(f"{dead.pid} 1 {token}")
    live = tmp_path / (SCRATCH_PREFIX + "live")
    live.mkdir()
    (live / OWNER_FILE).write_text(f"{os.getpid()} {started_at(os.getpid())} {uuid.uuid4().hex}")
    assert clean_abandoned_runs() == [str(abandoned)]
    left.wait(timeout=60)
    assert _alive_with(mark) == [] and not abandoned.exists() and live.exists()


def test_a_signal_during_the_clean_up_waits_until_it_is_done():
    from distlab.grading.run import Interrupted, signals_held, signals_raise

    order = []
    with pytest.raises(Interrupted) as stop, signals_raise():
        with signals_held():
            # raise_signal delivers it to this thread; os.kill(getpid()) may deliver it to
            # another thread of the pytest worker, and Python then ran the handler only
            # after the block (a whole-suite run failed so, "Signal 15 ignored")
            signal.raise_signal(signal.SIGTERM)
            order.append("cleaned up")  # not cut short by the signal
        order.append("after the clean-up")  # the signal arrives before this line
    assert order == ["cleaned up"]
    assert (str(stop.value), stop.value.exit_code) == ("SIGTERM", 143)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handlers are restored
