"""Grading kernels forked from the host's template (distlab.grading.forked_kernel): the
same kernel ``python -m ipykernel_launcher`` starts, with torch loaded already; a fresh
one where a fork would differ; exit codes, interrupts and deaths seen as jupyter_client
sees a child's; and nothing left when the host is killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import nbformat
import pytest
from process_waits import gone

from distlab.grading.forked_kernel import ForkedKernel, changes_its_environment
from distlab.grading.mutants import Kernel
from distlab.launch.starter import CAN_FORK
from distlab.launch.template import SOCKET_NAME, hosting, start_template, stop_template

pytestmark = pytest.mark.skipif(not CAN_FORK, reason="templates fork: Linux only")
SLOW = pytest.mark.slow  # each test starts kernels: 5-10 s

NOTEBOOK = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
WHO = (
    "import json, os, sys\n"
    "print(json.dumps({'pid': os.getpid(), 'parent': os.getppid(), 'cwd': os.getcwd(),\n"
    "    'argv0': sys.argv[0], 'jpy_parent': os.environ.get('JPY_PARENT_PID'),\n"
    "    'torch_loaded': 'torch' in sys.modules, 'session': os.getsid(0) == os.getpid()}))"
)


def _who(kernel: Kernel) -> dict:
    outputs = kernel.run(WHO)
    return json.loads(next(o["text"] for o in outputs if o.get("name") == "stdout"))


@SLOW
def test_a_hosted_kernel_is_the_templates_fork_and_the_kernel_a_launch_would_be(tmp_path):
    fresh_dir, forked_dir = tmp_path / "fresh", tmp_path / "forked"
    fresh_dir.mkdir(), forked_dir.mkdir()
    with Kernel(str(fresh_dir), notebook=NOTEBOOK) as kernel:  # no template: as usual
        assert isinstance(kernel.client.km.provisioner.process, subprocess.Popen)
        fresh = _who(kernel)
        fresh_path = kernel.run("import sys; print(sys.path)")[0]["text"]
    with hosting():
        with Kernel(str(forked_dir), notebook=NOTEBOOK) as kernel:
            process = kernel.client.km.provisioner.process
            assert isinstance(process, ForkedKernel)
            forked = _who(kernel)
            forked_path = kernel.run("import sys; print(sys.path)")[0]["text"]
            ranks = kernel.run("import distlab; print(distlab.run(lambda r, w: r * 10, 2))")
            assert ranks[0]["text"] == "[0, 10]\n", ranks
        assert process.poll() is not None and gone(forked["pid"], within=30)
    assert forked["torch_loaded"] and not fresh["torch_loaded"]
    assert forked["parent"] != os.getpid() and fresh["parent"] == os.getpid()
    for who, folder in ((fresh, fresh_dir), (forked, forked_dir)):
        assert who["cwd"] == str(folder) and who["session"], who
        assert who["argv0"].endswith("ipykernel_launcher.py") and who["jpy_parent"] == str(
            os.getpid()
        )
    assert forked_path == fresh_path


@SLOW
def test_a_fresh_kernel_where_a_fork_would_differ(tmp_path, monkeypatch):
    sets = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'import os\nos.environ.setdefault("KINETO_LOG_LEVEL", "6")\nimport torch'
    )])  # fmt: skip
    reads = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('os.environ["X"] == "1"')])
    assert changes_its_environment(sets) and not changes_its_environment(reads)
    with hosting():
        with Kernel(str(tmp_path), notebook=sets) as kernel:  # notebook 11's kind
            assert isinstance(kernel.client.km.provisioner.process, subprocess.Popen)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # read when torch loads: not the template's
        with Kernel(str(tmp_path), notebook=NOTEBOOK) as kernel:
            assert isinstance(kernel.client.km.provisioner.process, subprocess.Popen)
        monkeypatch.delenv("OMP_NUM_THREADS")
        with Kernel(str(tmp_path), notebook=NOTEBOOK) as kernel:
            assert isinstance(kernel.client.km.provisioner.process, ForkedKernel)


@SLOW
def test_exit_codes_interrupts_and_a_dead_kernel_as_from_a_child(tmp_path):
    from jupyter_core.utils import run_sync

    with hosting(), Kernel(str(tmp_path), notebook=NOTEBOOK, timeout=300) as kernel:
        km = kernel.client.km
        kc = kernel.client.kc
        # the cell says it runs with a file, not with output: an interrupt that lands in
        # ipykernel's own output code (a print's flush) can leave that kernel unable to go on
        flag = tmp_path / "running"
        sent = kc.execute(f"open({str(flag)!r}, 'w').close(); import time; time.sleep(120)")
        for _ in range(600):  # at most 60 s
            if flag.exists():
                break
            time.sleep(0.1)
        run_sync(km.interrupt_kernel)()  # what a cell's timeout sends
        reply = _until(kc.get_shell_msg, sent, lambda m: True)
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        assert run_sync(km.is_alive)()
        kc.execute("import os; os._exit(7)")  # the kernel dies
        process = km.provisioner.process
        assert process.wait(timeout=60) == 7
        assert not run_sync(km.is_alive)()


def _until(read, sent: str, wanted) -> dict:
    """The first message answering request ``sent`` that is ``wanted``, read with ``read``
    (each read waits at most 60 s); fails saying what came instead."""
    import queue

    from jupyter_core.utils import run_sync

    seen = []
    while True:
        try:
            message = run_sync(read)(timeout=60)
        except queue.Empty:
            pytest.fail(f"no wanted answer to {sent} within 60 s; came: {seen}")
        if message["parent_header"].get("msg_id") == sent and wanted(message):
            return message
        seen.append((message["msg_type"], str(message["content"])[:80]))


HOST = r"""
import json, os, sys, time
from distlab.grading.mutants import Kernel
from distlab.launch.template import hosting
import nbformat
with hosting():
    with Kernel(os.getcwd(), notebook=nbformat.v4.new_notebook()) as kernel:
        out = kernel.run("import os; print(os.getpid(), os.getppid())")
        print(json.dumps([int(x) for x in out[0]["text"].split()]), flush=True)
        time.sleep(600)
"""


@SLOW
def test_a_killed_host_leaves_no_kernel(tmp_path):
    host = subprocess.Popen(
        [sys.executable, "-c", HOST], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        kernel, template = json.loads(host.stdout.readline())
        assert template != host.pid, "the kernel was not forked by the template"
        os.kill(host.pid, signal.SIGKILL)
        # the template sees its host gone within 0.5 s and exits; the kernel dies with it
        assert gone(template, within=30), "the template outlived its host"
        assert gone(kernel, within=30), "the kernel outlived its template"
    finally:
        host.kill()
        host.wait()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@SLOW
def test_no_kernel_is_forked_for_an_asker_that_has_gone(tmp_path):
    """A grader stops waiting for the template's answer after a while (on a very busy
    machine the template may still be importing torch) and starts the kernel the usual way.
    The template, reaching that request later, must not fork a second kernel for it."""
    folder = tempfile.mkdtemp(prefix="distlab-template-", dir="/tmp")  # short: a socket path
    process = start_template(folder)
    try:
        path = os.path.join(folder, SOCKET_NAME)
        cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", str(tmp_path / "kernel.json")]
        request = json.dumps(["kernel", cmd, dict(os.environ), str(tmp_path)]).encode()
        stdin_read, stdin_write = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as asker:
            asker.connect(path)
            socket.send_fds(asker, [request], [stdin_read, 1, 2])
        # closed while the template still imports torch (seconds): the asker has gone
        os.close(stdin_read), os.close(stdin_write)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
            probe.connect(path)  # answered after the request above: the template takes turns
            hello = ["starter", {"OMP_NUM_THREADS": "not the template's"}, str(tmp_path)]
            socket.send_fds(probe, [json.dumps(hello).encode()], [1, 2])
            probe.settimeout(600)  # the template's import of torch, however busy the machine
            answer = json.loads(probe.recv(4096))
        assert answer[0] == "refused", answer
        assert _children(process.pid) == [], "the template forked a kernel nobody waits for"
    finally:
        stop_template(process)
        shutil.rmtree(folder, ignore_errors=True)


def test_which_notebooks_and_graders_fork_their_kernels(tmp_path):
    """A notebook that writes an environment variable gets a fresh kernel; nbgrader's child
    hosts a template for a class, and for one learner's notebook only if it starts processes."""
    from distlab.grading.nbgrader_main import _hosts_kernels

    cell = nbformat.v4.new_code_cell
    for source in ('os.environ["OMP_NUM_THREADS"] = "1"', "os.environ.update(A='1')",
                   "os.putenv('A', '1')", "os.environ.pop('A')"):  # fmt: skip
        assert changes_its_environment(nbformat.v4.new_notebook(cells=[cell(source)])), source
    for source in ('if os.environ["A"] == "1": pass', "print(os.environ.get('A'))"):
        assert not changes_its_environment(nbformat.v4.new_notebook(cells=[cell(source)]))
    runs, plain = tmp_path / "runs.ipynb", tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell("distlab.run(f, 2)")]), runs)
    nbformat.write(nbformat.v4.new_notebook(cells=[cell("x = 1")]), plain)
    autograde = [["autograde", "*"]]
    assert _hosts_kernels(autograde, None) and not _hosts_kernels([["generate_assignment"]], None)
    assert _hosts_kernels(autograde, ["out", "s", "a", "n", str(runs)])
    assert not _hosts_kernels(autograde, ["out", "s", "a", "n", str(plain)])
