"""The template's forked child becomes a Jupyter kernel: the launch it stands for, checked and copied.

A grader asks the template (:mod:`distlab.launch.template`) for a kernel by sending the
command jupyter_client would have run, ``<python> -m ipykernel_launcher -f <connection
file>``, with its environment and folder (the asking side is
:mod:`distlab.grading.forked_kernel`). The template forks only when the fork would be that
kernel (:func:`refusal`): the same Python, an ipykernel launch, and every variable read
when torch or Python loads (:data:`distlab.launch.starter.READ_AT_IMPORT`) equal to the
template's own, for torch is already imported in the fork. The child then becomes the
kernel (:func:`become_kernel`): what ``python -m`` would have set up, then ipykernel's own
``__main__``.

ipykernel itself is not imported before the fork: its ``parent_handle`` default reads
``JPY_PARENT_PID`` (which each launch sets) when the module loads. jupyter_client, which
reads no such variable, is (:func:`prepare`).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import runpy
import signal
import sys

from .starter import _read_at_import, import_refusal

#: The command a forked kernel stands for: ``<this python> -m ipykernel_launcher ...``.
LAUNCHER = ["-m", "ipykernel_launcher"]

#: What every kernel imports and the template may import once for all of them.
PRELOADED = ("jupyter_client",)

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def prepare() -> str | None:
    """In the template, before any fork: import :data:`PRELOADED`. Why kernels cannot be
    forked here (no ipykernel installed), or None."""
    if importlib.util.find_spec("ipykernel_launcher") is None:
        return "no ipykernel here"
    for module in PRELOADED:
        importlib.import_module(module)
    return None


def refusal(cmd: list[str], env: dict[str, str], loaded_with: dict[str, str]) -> str | None:
    """Why the template cannot fork the kernel ``cmd`` with ``env`` (None: it can).
    ``loaded_with``: the template's own variables read at import."""
    if not (cmd[:1] and os.path.realpath(cmd[0]) == os.path.realpath(sys.executable)):
        return f"another Python: {cmd[:1]}"
    if cmd[1:3] != LAUNCHER:
        return f"not an ipykernel launch: {cmd[1:3]}"
    if not hasattr(os, "pidfd_open"):
        return "no pidfd on this system"
    return import_refusal(_read_at_import(env), loaded_with)


def become_kernel(cmd: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> None:
    """In the template's forked child: become ``cmd``'s kernel and run it; never returns.

    A session of its own (``start_new_session``, as jupyter_client starts kernels); killed
    when the template ends; the given stdin, stdout and stderr; the folder and environment
    asked for; ``sys.argv`` and ``sys.path[0]`` as ``python -m ipykernel_launcher`` sets
    them. The kernel's own exit (``SystemExit``) ends the process as it would a fresh one,
    through the interpreter's shutdown (atexit handlers run)."""
    template = os.getppid()
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != template:  # the template ended before the line above
        os._exit(1)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [importlib.util.find_spec("ipykernel_launcher").origin, *cmd[3:]]
    if sys.path[:1] == [""]:  # the template's `-c`; `python -m` puts the folder itself first
        sys.path[0] = os.getcwd()
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    raise SystemExit(0)
