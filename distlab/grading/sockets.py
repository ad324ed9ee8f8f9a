"""Kernels that talk to the grader over Unix sockets of their own, not TCP ports.

A Jupyter kernel started the usual way is told five TCP port numbers that jupyter_client
found free a moment earlier, and binds them only once it has started. Any process that
takes one of them in between makes the kernel die with "Address already in use" before it
answers; gloo opens a TCP connection per pair of ranks, each from a fresh ephemeral port,
so a machine running distributed jobs next to the grader does take them (CI lost a
mutation check to it, with two test workers busy side by side). A socket file in a folder
of the grader's own cannot be taken.
"""

from __future__ import annotations

import os

from distlab.launch.template import MAX_SOCKET_PATH  # the limit, stated once


def use_private_sockets(km) -> None:
    """Make the kernel manager ``km`` (not started yet) give its kernel Unix sockets named
    after a fresh id in Jupyter's runtime folder instead of TCP ports (not on Windows).
    jupyter_client removes the files with the kernel (``cleanup_resources``). A Unix socket's path may not exceed about 100
    bytes (:data:`MAX_SOCKET_PATH`): where the runtime folder's path is too long, the
    system's temporary folder is used, and where that is too, TCP."""
    import tempfile
    import uuid

    from jupyter_core.paths import jupyter_runtime_dir

    if os.name == "nt":
        return
    name = f"kernel-{uuid.uuid4().hex[:12]}-ipc"
    for folder in (jupyter_runtime_dir(), tempfile.gettempdir()):
        prefix = os.path.join(folder, name)
        if len(os.fsencode(prefix)) + len("-99") <= MAX_SOCKET_PATH:
            os.makedirs(folder, exist_ok=True)
            km.transport = "ipc"
            km.ip = prefix
            return
