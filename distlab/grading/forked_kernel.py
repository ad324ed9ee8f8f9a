"""Grading kernels forked from the template that imported torch once, not started afresh.

A Jupyter kernel is a fresh ``python -m ipykernel_launcher``: about 0.6 s of CPU to load
ipykernel and IPython, then about 2.5 s more when the notebook's first cell imports torch.
Grading a class starts one kernel per notebook, and ``distlab grade --exercise`` one per
exercise, so on a 2-core laptop the imports cost more than most notebooks' cells.

A process that hosts kernels already keeps a template (:mod:`distlab.launch.template`)
that imported torch for the kernels' worker starters. A kernel manager set up by
:func:`use_template_kernels`
asks it for each kernel: the template forks, and the child becomes the kernel that
``python -m ipykernel_launcher`` would have been
(:func:`distlab.launch.kernel_child.become_kernel`): the same
arguments, environment, working folder, ``sys.path`` and standard streams, in a session
of its own. Importing torch in its first cell then finds torch loaded.

What makes the fork the same kernel:

* the template refuses (and the kernel starts the usual way) unless the command is this
  Python's ``-m ipykernel_launcher`` and every variable read when torch or Python loads
  (:data:`distlab.launch.starter.READ_AT_IMPORT`) is what the template loaded with
  (:func:`distlab.launch.kernel_child.refusal`);
* a notebook that changes its environment variables (notebook 11 sets the profiler's log
  level before ``import torch``) always runs in a fresh kernel: in a fork torch would
  have loaded before the cell ran (:func:`changes_its_environment`);
* the template runs no torch code before it forks, so no thread pool is copied half-way;
* ipykernel is not loaded in the template: it reads a variable the kernel's launch sets
  (``JPY_PARENT_PID``) when it is imported, so each kernel imports it (about 0.6 s).

The kernel's handle (:class:`ForkedKernel`) is what jupyter_client uses of a
:class:`subprocess.Popen`: the template reports the kernel's exit code on the socket the
request came on, and signals reach the kernel through a pidfd, which cannot name another
process once the kernel has ended. A kernel dies with its template (``PR_SET_PDEATHSIG``),
and the template ends with the process that hosts it, so nothing outlives the grader.
Linux only, as the template; elsewhere kernels start the usual way.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys

from jupyter_client.provisioning import LocalProvisioner

from distlab.launch.starter import CAN_FORK, TEMPLATE_ENV_VAR

#: The name this module's provisioner is registered under (``pyproject.toml``'s
#: ``jupyter_client.kernel_provisioners`` entry point).
PROVISIONER = "distlab-template-kernel"

#: A code cell that sets, updates or removes an environment variable.
_CHANGES_ENVIRONMENT = re.compile(
    r"environ\s*\[[^\]]*\]\s*=(?!=)|environ\.(setdefault|update|pop|clear)\(|putenv\(|unsetenv\("
)


def changes_its_environment(nb) -> bool:
    """True if a code cell of ``nb`` changes an environment variable (such a notebook gets a
    fresh kernel: a variable torch reads when it loads would come too late in a fork)."""
    return any(
        _CHANGES_ENVIRONMENT.search(cell.source)
        for cell in nb.cells
        if cell.get("cell_type") == "code"
    )


def use_template_kernels(km, nb) -> None:
    """Make the kernel manager ``km`` (not started yet) ask the hosting process's template
    for its kernel (:class:`TemplateProvisioner`), unless ``nb`` changes its environment or
    the provisioner is not installed. Without a template it starts kernels as usual."""
    if not CAN_FORK or changes_its_environment(nb):
        return
    from jupyter_client.provisioning import KernelProvisionerFactory

    if not KernelProvisionerFactory.instance()._check_availability(PROVISIONER):
        return  # an install without distlab's entry points (an old egg-info): as usual
    spec = km.kernel_spec
    if spec is not None:
        spec.metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONER}


class TemplateProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, with the kernel forked by the template named in
    ``$DISTLAB_STARTER_TEMPLATE`` when there is one that agrees to (:func:`fork_kernel`)."""

    async def launch_kernel(self, cmd: list[str], **kwargs):
        forked = fork_kernel(cmd, **kwargs)
        if forked is None:
            return await super().launch_kernel(cmd, **kwargs)
        self.process = forked
        self.pid = self.pgid = forked.pid  # it leads a session (and group) of its own
        self.cwd = kwargs.get("cwd", pathlib.Path.cwd())
        return self.connection_info


class ForkedKernel:
    """A kernel the template forked: not this process's child, so its exit code comes from
    the template, and signals go through a pidfd. What jupyter_client's provisioner uses of
    :class:`subprocess.Popen`."""

    stdin = stdout = stderr = None

    def __init__(self, sock: socket.socket, pid: int, pidfd: int):
        self.pid = pid
        self.returncode: int | None = None
        self._sock, self._pidfd = sock, pidfd

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._sock], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._sock], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            self._ended()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _ended(self) -> None:
        """Read the template's report: ``["exited", code]``, or nothing when the template
        itself ended (the kernel was killed with it: ``PR_SET_PDEATHSIG``)."""
        try:
            message = json.loads(self._sock.recv(4096) or b"null")
        except (OSError, ValueError):
            message = None
        ok = isinstance(message, list) and message[:1] == ["exited"]
        self.returncode = int(message[1]) if ok else -signal.SIGKILL
        self._close()

    def _close(self) -> None:
        self._sock.close()
        os.close(self._pidfd)

    def __del__(self) -> None:
        if self.returncode is None:
            self._close()


def fork_kernel(cmd: list[str], **kwargs) -> ForkedKernel | None:
    """Ask the template for the kernel ``cmd`` would start, with what jupyter_client's
    ``launch_kernel`` would give it (``env``, ``cwd``; ``JPY_PARENT_PID``; stdin a pipe
    closed at once; this process's stdout and stderr). None when there is no template, it
    refuses, or the launch asks for something a fork does not do (its own streams, an
    independent kernel): the kernel then starts the usual way."""
    path = os.environ.get(TEMPLATE_ENV_VAR)
    streams = [kwargs.get(k) for k in ("stdin", "stdout", "stderr")]
    if not CAN_FORK or not path or any(streams) or kwargs.get("independent"):
        return None
    env = dict(kwargs.get("env") or os.environ)
    env["JPY_PARENT_PID"] = str(os.getpid())
    cwd = os.fspath(kwargs.get("cwd") or os.getcwd())
    request = json.dumps(["kernel", [os.path.expanduser(s) for s in cmd], env, cwd]).encode()
    stdin_read, stdin_write = os.pipe()
    os.close(stdin_write)  # as jupyter_client closes the kernel's stdin pipe at once
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
        streams = [stdin_read, sys.__stdout__.fileno(), sys.__stderr__.fileno()]
        socket.send_fds(sock, [request], streams)
        # the template may still import; a template that takes longer (a very busy machine)
        # sees this end closed and forks nothing: the kernel then starts the usual way
        ready, _, _ = select.select([sock], [], [], 120)
        message, fds, _, _ = socket.recv_fds(sock, 4096, 1) if ready else (b"", [], 0, None)
        answer = json.loads(message or b"null")
    except (OSError, ValueError, AttributeError):
        answer, fds = None, []
    finally:
        os.close(stdin_read)
    if isinstance(answer, list) and answer[:1] == ["forked"] and len(fds) == 1:
        return ForkedKernel(sock, int(answer[1]), fds[0])
    for fd in fds:
        os.close(fd)
    sock.close()
    return None
