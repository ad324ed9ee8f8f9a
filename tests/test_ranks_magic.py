"""``%ranks`` and ``%%ranks`` (distlab.ranks): N ranks that keep their namespaces between cells.

The fast tests check the pieces that need no processes (labels, grouping, where a stuck rank
was, how a cell is compiled, what ``import distlab`` loads). The slow ones run the magic the
way a learner does: in a real IPython kernel started by jupyter_client, executing cells and
reading what the kernel publishes on iopub (streams, display data, errors), and they look
for leftover processes in /proc.

Time limits here bound the work, not the machine's speed: every cell that can hang ends by
its own ``%ranks`` timeout (a few seconds, set per test), and a kernel message may take up
to :data:`MESSAGE_S` on a loaded 2-core machine (the first ``%ranks start`` imports torch in
the kernel and in the launcher's starter: 8 s measured on a quiet machine).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distlab.core.processes import descendants, is_running, started_at
from distlab.ranks import rank as rank_side
from distlab.ranks.session import where_in_cell
from distlab.ranks.show import grouped, rank_label

MESSAGE_S = 180  # the longest wait for one iopub message: a busy machine importing torch
GONE_S = 30  # processes watching a dead parent exit within about a second; 30 on a busy one


# ------------------------------------------------------------------ fast ---
def test_rank_labels_name_runs_of_ranks():
    assert rank_label([2]) == "rank 2"
    assert rank_label([3, 0, 1, 2]) == "ranks 0-3"
    assert rank_label([0, 2]) == "ranks 0, 2"
    assert rank_label([0, 1]) == "ranks 0, 1"
    assert rank_label([0, 1, 2, 5]) == "ranks 0-2, 5"


def test_equal_values_are_grouped_in_order_of_their_first_rank():
    assert grouped({3: "b", 0: "a", 1: "b", 2: "a"}) == [([0, 2], "a"), ([1, 3], "b")]
    assert grouped({}) == []


def test_a_cell_shows_its_last_expression_unless_it_ends_with_a_semicolon():
    namespace = {}
    body, last = rank_side._compile("x = 2\nx * 3", "<cell 1>")
    exec(body, namespace)  # noqa: S102
    assert eval(last, namespace) == 6
    assert rank_side._compile("x = 2\nx * 3;", "<cell 1>")[1] is None
    assert rank_side._compile("x = 2", "<cell 1>")[1] is None


def test_a_stuck_rank_is_placed_at_its_collective_and_its_line_of_the_cell():
    stack = """Thread 0x00007f (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 2930 in all_reduce
  File "/venv/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "<cell 4>", line 3 in <module>
  File "/src/distlab/ranks/rank.py", line 108 in run_cell
  File "/src/distlab/ranks/rank.py", line 60 in serve
  File "/src/distlab/launch/worker.py", line 230 in _run_job
  File "/src/distlab/launch/worker.py", line 80 in _worker_main
"""
    code = "x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)\n"
    assert where_in_cell(stack, 4, code) == (
        "torch.distributed.all_reduce, at line 3 of the cell: dist.all_reduce(x)"
    )
    assert where_in_cell("", 4, code) == "an unknown place (its stack could not be read)"


def test_import_distlab_loads_neither_ipython_nor_the_magic():
    code = (
        "import sys, distlab; assert callable(distlab.load_ipython_extension); "
        "print([m for m in ('IPython', 'distlab.ranks') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------- in a real kernel ---
@dataclass
class Ran:
    """What one executed cell published."""

    stdout: str = ""
    stderr: str = ""
    shown: list[str] = field(default_factory=list)  # text/plain of each display / result
    images: int = 0
    error: dict | None = None  # ename, evalue, traceback (joined)


class Kernel:
    """A real IPython kernel, driven as a notebook front end drives it."""

    def __init__(self, cwd):
        from jupyter_client import KernelManager

        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=MESSAGE_S)
        self.pid = self.manager.provisioner.process.pid

    def run(self, code: str, *, interrupt_on: str | None = None) -> Ran:
        """Execute ``code``; with ``interrupt_on``, interrupt the kernel once the cell has
        printed that text (on every rank that prints it), as the notebook's stop button."""
        msg_id = self.client.execute(code)
        ran = Ran()
        while True:
            message = self.client.get_iopub_msg(timeout=MESSAGE_S)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                setattr(ran, content["name"], getattr(ran, content["name"]) + content["text"])
                if interrupt_on and interrupt_on in ran.stdout:
                    time.sleep(0.5)  # let every rank get into what the cell does next
                    self.manager.interrupt_kernel()
                    interrupt_on = None
            elif kind in ("display_data", "execute_result"):
                ran.shown.append(content["data"].get("text/plain", ""))
                ran.images += "image/png" in content["data"]
            elif kind == "error":
                ran.error = dict(content, traceback="\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return ran

    def value(self, expression: str) -> str:
        ran = self.run(f"print({expression})")
        assert ran.error is None, ran.error
        return ran.stdout.strip()

    def processes(self) -> set[int]:
        """The kernel's descendants now (the starter, the ranks, what they started)."""
        return descendants(self.pid)

    def close(self) -> None:
        self.client.stop_channels()
        if self.manager.is_alive():
            self.manager.shutdown_kernel(now=True)


def gone(pids: dict[int, str]) -> bool:
    """Wait until none of ``pids`` (pid -> started_at) runs any more; True if so."""
    end = time.monotonic() + GONE_S
    while time.monotonic() < end:
        if not any(is_running(pid, started) for pid, started in pids.items()):
            return True
        time.sleep(0.2)
    return False


def snapshot(pids) -> dict[int, str]:
    return {pid: started_at(pid) for pid in pids}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(tmp_path_factory.mktemp("ranks-kernel"))
    assert k.run("%load_ext distlab").error is None
    yield k
    k.close()


def start(kernel: Kernel, n: int, timeout: float) -> None:
    ran = kernel.run(f"%ranks start {n} --timeout {timeout}")
    assert ran.error is None and f"{n} ranks ready" in ran.stdout, ran


def rank_pids(kernel: Kernel) -> list[int]:
    """Each rank's process id, gathered into the notebook as a learner would."""
    kernel.run("%%ranks\nimport os\npid = os.getpid()")
    kernel.run("%ranks gather pid")
    return [int(p) for p in kernel.value("' '.join(map(str, pid))").split()]


@pytest.mark.slow
def test_bad_input_names_what_is_wrong(kernel):
    cases = {
        "%%ranks\nx = 1": "no ranks are running; start them with %ranks start 4",
        "%ranks start 0": "the number of ranks must be an integer in 1..64, got 0",
        "%ranks start four": "%ranks start takes a number of ranks",
        "%ranks start 2 --color red": "'--color' needs a value, or is not an option",
        "%ranks launch 4": "%ranks 'launch 4': not a command",
        "%ranks push nowhere": "no ranks are running",
    }
    for code, said in cases.items():
        ran = kernel.run(code)
        assert said in ran.stderr and "UsageError" in ran.stderr, (code, ran)
    start(kernel, 4, timeout=30)
    cases = {
        "%%ranks 7\nx = 1": "there is no rank 7: the 4 ranks are 0-3",
        "%%ranks zero\nx = 1": "name ranks by number, like %%ranks 0,2",
        "%ranks gather nothing_here": "cannot gather nothing_here: on ranks 0-3, 'nothing_here' "
        "is not defined",
        "%ranks push nowhere": "nowhere is not defined in the notebook",
    }
    for code, said in cases.items():
        ran = kernel.run(code)
        assert said in ran.stderr, (code, ran)
    kernel.run("%%ranks 1,3\nhalf = rank")
    ran = kernel.run("%ranks gather half")
    assert "cannot gather half: on ranks 0, 2, 'half' is not defined" in ran.stderr, ran


@pytest.mark.slow
def test_state_lives_between_cells_and_equal_values_are_shown_once(kernel):
    start(kernel, 4, timeout=30)
    ran = kernel.run("%%ranks\nx = torch.full((4,), float(rank))\ndist.all_reduce(x)\nx")
    assert ran.error is None and ran.shown == ["[ranks 0-3] tensor([6., 6., 6., 6.])"], ran
    ran = kernel.run("%%ranks 0,2\nx[0] += 1\nprint('changed on', rank)")
    assert ran.error is None and ran.shown == [], ran
    assert sorted(ran.stdout.splitlines()) == ["[rank 0] changed on 0", "[rank 2] changed on 2"]
    ran = kernel.run("%%ranks\nx")
    assert ran.shown == [
        "[ranks 0, 2] tensor([7., 6., 6., 6.])",
        "[ranks 1, 3] tensor([6., 6., 6., 6.])",
    ], ran
    ran = kernel.run("%%ranks\nimport sys\nprint('to stderr', file=sys.stderr)\nx.sum();")
    assert ran.shown == [] and "[rank 3] to stderr" in ran.stderr, ran


@pytest.mark.slow
def test_gather_brings_values_into_the_notebook_and_push_sends_one_to_every_rank(kernel):
    start(kernel, 4, timeout=30)
    kernel.run("%%ranks\nsquare = rank * rank")
    ran = kernel.run("%ranks gather square\nprint(square)")
    assert ran.error is None and ran.stdout.strip() == "[0, 1, 4, 9]", ran
    kernel.run("step = {'lr': 0.5}\n%ranks push step")
    ran = kernel.run("%%ranks\nstep['lr'] * rank")
    assert ran.shown == ["[rank 0] 0.0", "[rank 1] 0.5", "[rank 2] 1.0", "[rank 3] 1.5"], ran


@pytest.mark.slow
def test_figures_and_rich_values_are_shown_per_rank(kernel):
    start(kernel, 2, timeout=60)  # importing matplotlib on two ranks
    ran = kernel.run("%%ranks\nimport matplotlib.pyplot as plt\nplt.plot([0, rank]);")
    assert ran.error is None and ran.images == 2, ran
    assert sorted(ran.stdout.splitlines()) == ["[rank 0]", "[rank 1]"], ran


@pytest.mark.slow
def test_a_raising_rank_shows_its_traceback_and_every_namespace_survives(kernel):
    start(kernel, 4, timeout=30)
    kernel.run("%%ranks\nkept = rank + 100")
    ran = kernel.run("%%ranks\nif rank == 1:\n    1 / 0\ndone = True")
    assert ran.error and ran.error["ename"] == "CellError", ran
    shown = ran.error["traceback"]
    assert "rank 1 raised in the cell; ranks 0, 2, 3 finished it" in shown
    assert 'File "<cell ' in shown and "1 / 0" in shown and "ZeroDivisionError" in shown
    assert "rank.py" not in shown, "the rank's own frames are left out"
    ran = kernel.run("%%ranks\n(kept, 'done' in dir())")
    assert ran.shown == [
        "[rank 0] (100, True)",
        "[rank 1] (101, False)",
        "[ranks 2, 3] (102, True)",
    ] or ran.shown == [
        "[rank 0] (100, True)",
        "[rank 1] (101, False)",
        "[rank 2] (102, True)",
        "[rank 3] (103, True)",
    ], ran


@pytest.mark.slow
def test_a_deadlock_ends_after_the_timeout_with_each_stack_and_fresh_ranks(kernel):
    start(kernel, 3, timeout=4)
    kernel.run("%%ranks\nx = torch.ones(2)")
    before = snapshot(rank_pids(kernel))
    ran = kernel.run("%%ranks\nif rank == 0:\n    dist.all_reduce(x)")
    assert ran.error and ran.error["ename"] == "CellTimeoutError", ran
    said = ran.error["traceback"]
    assert "ran past its 4 s timeout: rank 0 had not finished" in said, said
    assert "rank 0 was in torch.distributed.all_reduce, at line 2 of the cell" in said, said
    assert (
        "3 fresh ranks started" in said and "Lost with the old ranks: pid, x on ranks 0-2" in said
    )
    assert gone(before), "the stuck ranks were not all ended"
    ran = kernel.run("%%ranks\n(rank, 'x' in dir())")
    assert ran.error is None
    assert ran.shown == ["[rank 0] (0, False)", "[rank 1] (1, False)", "[rank 2] (2, False)"]


@pytest.mark.slow
def test_a_killed_rank_is_reported_with_its_exit_code_and_start_brings_a_fresh_group(kernel):
    start(kernel, 3, timeout=30)
    pids = rank_pids(kernel)
    before = snapshot(pids)
    os.kill(pids[1], signal.SIGKILL)  # while idle, between cells
    ran = kernel.run("%%ranks\nrank")
    assert ran.error and ran.error["ename"] == "RankDiedError", ran
    said = ran.error["traceback"]
    assert "rank 1 died: its process was killed by SIGKILL (exit code -9)" in said, said
    assert "ranks 0, 2 were stopped too" in said and "%ranks start 3" in said, said
    assert gone(before)
    ran = kernel.run("%%ranks\nrank")
    assert "no ranks are running: rank 1 died" in ran.stderr, ran
    start(kernel, 3, timeout=30)
    ran = kernel.run("%%ranks\nimport os\nif rank == 2:\n    os._exit(7)\ndist.barrier()")
    assert ran.error and "rank 2 died: its process exited with code 7" in ran.error["traceback"]


@pytest.mark.slow
def test_ctrl_c_interrupts_every_rank_and_keeps_their_namespaces(kernel):
    start(kernel, 3, timeout=60)
    kernel.run("%%ranks\nkept = rank")
    ran = kernel.run(
        "%%ranks\nimport time\nprint('sleeping', flush=True)\nfor _ in range(600):\n"
        "    time.sleep(0.1)\nkept = -1",
        interrupt_on="sleeping",
    )
    assert ran.error and ran.error["ename"] == "CellInterrupted", ran
    assert "ranks 0-2 stopped the cell. Every rank keeps its namespace" in ran.error["evalue"]
    ran = kernel.run("%%ranks\nkept")
    assert ran.shown == ["[rank 0] 0", "[rank 1] 1", "[rank 2] 2"], ran
    # A rank inside a collective does not see the interrupt: it counts as stuck.
    ran = kernel.run(
        "%%ranks\nprint('waiting', flush=True)\nif rank == 0:\n    dist.barrier()",
        interrupt_on="waiting",
    )
    assert ran.error and ran.error["ename"] == "CellTimeoutError", ran
    said = ran.error["traceback"]
    assert "did not stop when interrupted: rank 0 had not finished" in said, said
    assert "torch.distributed.barrier" in said and "3 fresh ranks started" in said, said
    assert kernel.run("%%ranks\nrank").error is None


@pytest.mark.slow
def test_nothing_is_left_after_stop(kernel):
    start(kernel, 4, timeout=30)
    kernel.run("%%ranks\nimport subprocess\nchild = subprocess.Popen(['sleep', '600'])")
    ranks_and_children = snapshot(kernel.processes())
    assert len(ranks_and_children) >= 1 + 4 + 4  # the starter, 4 ranks, 4 sleeps
    assert "stopped 4 ranks" in kernel.run("%ranks stop").stdout
    left = kernel.processes()
    kernel.run("import distlab.launch.parent as _launch_parent")
    starter = int(kernel.value("_launch_parent._starter.pid"))
    assert left <= {starter}, "only the launcher's idle starter may stay (distlab.shutdown())"
    assert gone({p: s for p, s in ranks_and_children.items() if p != starter})


@pytest.mark.slow
@pytest.mark.parametrize("how", ["shutdown", "SIGKILL"])
def test_nothing_outlives_the_kernel(tmp_path, how):
    kernel = Kernel(tmp_path)
    try:
        assert kernel.run("%load_ext distlab").error is None
        start(kernel, 2, timeout=30)
        kernel.run("%%ranks\nimport subprocess\nchild = subprocess.Popen(['sleep', '600'])")
        everything = snapshot(kernel.processes())
        assert len(everything) >= 1 + 2 + 2  # the starter, 2 ranks, 2 sleeps
        if how == "SIGKILL":
            os.kill(kernel.pid, signal.SIGKILL)
        else:
            kernel.manager.shutdown_kernel(now=False)
        assert gone(everything), f"left after the kernel's {how}: {everything}"
    finally:
        kernel.close()


@pytest.mark.slow
def test_the_readme_example_runs_cell_by_cell(kernel):
    """The ``ipython`` block of the page on running code (docs/running.md, once the README's),
    one cell per paragraph, says what it shows."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "running.md").read_text()
    block = re.search(r"```ipython\n(.*?)```", readme, flags=re.DOTALL).group(1)
    shown = []
    for cell in block.strip().split("\n\n"):
        ran = kernel.run(cell.strip())
        assert ran.error is None and "Error" not in ran.stderr, (cell, ran)
        shown += ran.shown
    assert shown == ["[ranks 0-3] tensor([6., 6., 6., 6.])"]
    assert "tensor([6., 6., 6., 6.])" in readme
    assert kernel.value("x[0]") == "tensor([7., 6., 6., 6.])"
