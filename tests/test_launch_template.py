"""A host's starter template (distlab.launch.template): the kernels it starts fork their
worker starters from it, each its own, and nothing it forks outlives what it serves.

Each "kernel" here is a plain Python started by the test (what a grading child or
nbgrader starts, but without Jupyter): it calls ``distlab.run`` and reports who started its
starter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from process_waits import gone

from distlab.core.processes import parents
from distlab.launch.starter import CAN_FORK, TEMPLATE_ENV_VAR
from distlab.launch.template import hosting

pytestmark = pytest.mark.skipif(not CAN_FORK, reason="templates fork: Linux only")
SLOW = pytest.mark.slow  # each kernel imports torch: 3-5 s

KERNEL = r"""
import json, os, sys, distlab
from distlab.launch.parent import _starter

def where(rank, world_size):
    return os.getcwd(), os.getppid()

ranks = distlab.run(where, 2)
with open(f"/proc/{_starter.pid}/stat") as stat:
    starter_parent = int(stat.read().rpartition(")")[2].split()[1])
print(json.dumps({"ranks": ranks, "starter": _starter.pid, "starter_parent": starter_parent}))
"""


def _kernel(tmp_path, **env) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", KERNEL], cwd=tmp_path, env={**os.environ, **env},
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def _children_commands() -> dict[int, bytes]:
    """This process's live children (:func:`distlab.core.processes.parents`): pid -> command
    line."""
    children = {}
    for pid, parent in parents().items():
        if parent == os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    children[pid] = cmdline.read()
            except OSError:
                continue
    return children


def _template_pid(within: float = 30) -> int:
    """The template this process started: its child that runs distlab.launch.template. Looked
    for again until ``within`` seconds have passed (a bound on the wait, not on the work: one
    run of the slow tier, at load 25, once found none at the first look)."""
    deadline = time.monotonic() + within
    while True:
        children = _children_commands()
        found = [pid for pid, command in children.items() if b"distlab.launch.template" in command]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no template process among this process's children: {children}")
        time.sleep(0.2)


@SLOW
def test_each_kernel_gets_a_starter_of_its_own_forked_by_the_template(tmp_path):
    with hosting():
        assert os.environ[TEMPLATE_ENV_VAR].endswith(".sock")
        template = _template_pid()
        first, second = _kernel(tmp_path), _kernel(tmp_path)
        # a variable torch reads at import differs: the kernel starts its own starter
        own = _kernel(tmp_path, OMP_NUM_THREADS="1")
    assert TEMPLATE_ENV_VAR not in os.environ, "the variable outlived the block"
    for run in (first, second):
        assert run["starter_parent"] == template, run
        # the workers are the starter's forks, in the kernel's folder
        assert [tuple(r) for r in run["ranks"]] == [(str(tmp_path), run["starter"])] * 2
    assert first["starter"] != second["starter"], "two kernels shared one starter"
    assert own["starter_parent"] != template, own
    assert gone(template, within=10), "the template outlived hosting()"


HOST = r"""
import subprocess, sys, time
from distlab.launch.template import hosting
with hosting():
    kernel = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    print(kernel.stdout.readline(), flush=True)
    time.sleep(600)
"""

#: A kernel that reports its pid and the template's socket too, then stays until killed.
STAYING_KERNEL = (
    KERNEL.replace(
        '"ranks": ranks',
        f'"pid": os.getpid(), "socket": os.environ["{TEMPLATE_ENV_VAR}"], "ranks": ranks',
    )
    + "import time\ntime.sleep(600)\n"
)


@SLOW
def test_the_starter_ends_with_its_kernel_and_the_template_with_its_host(tmp_path):
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, STAYING_KERNEL],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        report = json.loads(host.stdout.readline())
        template, starter, kernel = report["starter_parent"], report["starter"], report["pid"]
        folder = os.path.dirname(report["socket"])
        os.kill(kernel, signal.SIGKILL)  # the kernel dies without a word
        assert gone(starter, within=30), "the starter outlived its kernel"
        os.kill(host.pid, signal.SIGKILL)  # and so does the host
        assert gone(template, within=30), "the template outlived its host"
        assert not os.path.exists(folder), "the killed host's template folder was left behind"
    finally:
        host.kill()
        host.wait()


@SLOW
def test_a_garbled_hello_is_refused_and_the_template_serves_on(tmp_path):
    import socket

    with hosting():
        template = _template_pid()
        for hello in (b"not json", b'["starter"]', b'["starter", 3, "/"]'):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(os.environ[TEMPLATE_ENV_VAR])
            socket.send_fds(sock, [hello], [1, 2])
            answer = json.loads(sock.recv(4096))
            sock.close()
            assert answer[0] == "refused", (hello, answer)
        assert not gone(template, within=0.5), "a garbled hello ended the template"
        assert _kernel(tmp_path)["starter_parent"] == template


def test_without_a_template_a_host_hides_the_one_it_inherited(monkeypatch):
    """A contained grading run that hosts no template of its own must not hand its kernels
    the path of one outside it (their starters would live outside the run)."""
    monkeypatch.setenv(TEMPLATE_ENV_VAR, "/somewhere/outside.sock")
    with hosting(False):
        assert TEMPLATE_ENV_VAR not in os.environ
    assert os.environ[TEMPLATE_ENV_VAR] == "/somewhere/outside.sock"
