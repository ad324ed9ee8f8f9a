"""Start a notebook's kernel first, and let it import what the first cell imports meanwhile.

The exercise runner (``distlab grade --exercise``, a contained child process) spends its
first seconds loading nbgrader, for its Execute step and its grading rule; the kernel
spends its first seconds starting and importing torch for the first cell. One after the
other, the learner waits for both. :func:`start_kernel` starts the kernel before nbgrader
loads, as nbclient would start it (the notebook's kernelspec, the run folder, an
in-memory history), and sends it the first cell's leading imports
(:func:`distlab.grading.slicing.leading_imports`) to run while nbgrader loads; the
Execute step then runs every cell, the first one included, in that kernel.

Why this leaves every grade as it was:

* importing a module again returns the module the first import loaded, so the first cell
  does exactly what it did; it binds its names itself, because the early imports run in
  a namespace of their own, not the notebook's;
* the early request is ``silent`` (no execution count, no history, no ``_``) and does not
  stop the queue on an error: a failing import fails again, in the first cell;
* only statements that do nothing but import (and ``%matplotlib`` lines, which choose the
  plotting backend, in their order) are sent, and only those before anything else in the
  cell: a cell that sets an environment variable before ``import torch`` (notebook 11
  does, for the profiler) sends the imports above that line only;
* nothing is sent when the first cell is a test cell; what the early imports print goes
  nowhere, but it belongs to no test cell;
* when a cell calls ``distlab.run``, the launcher's starter is started too
  (:data:`PRESTART`): the first run would start the same process, later.

The kernel inherits the child's environment, so :func:`distlab.grading.run.run_contained`
ends it with everything else.

Every kernel the grader starts (here, in the Execute step and in the mutation check) talks
to its client over Unix sockets of its own (:mod:`distlab.grading.sockets`), not TCP ports.

The child itself is ``python -m distlab.grading.kernel RUN [RUN ...] [--timeout S]``
(:func:`main`): one run folder per exercise to grade, each in a fresh kernel of its own.
Running it as a module of :mod:`distlab.grading` matters: the package loads first and keeps
the slow modules no grading process uses out of this one
(:data:`distlab.grading.run.UNUSED_SLOW_MODULES`). A child that imported ``nbformat`` before
``distlab.grading`` paid about 2.5 s more on every exercise.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from distlab.grading.cells import is_graded
from distlab.grading.forked_kernel import use_template_kernels
from distlab.grading.slicing import leading_imports
from distlab.grading.sockets import use_private_sockets
from distlab.launch.template import hosting


@dataclass
class EarlyKernel:
    """A started kernel (``manager``: jupyter_client's AsyncKernelManager) and the client
    that sent it the early imports."""

    manager: object
    client: object

    def shut_down(self) -> None:
        """Stop the client's channels and end the kernel at once. The notebook has run and
        its outputs are read: a polite shutdown (nbclient's) would only add about a second
        of waiting, and whatever the kernel started is ended by the contained run anyway."""
        from jupyter_core.utils import run_sync

        self.client.stop_channels()
        if run_sync(self.manager.is_alive)():
            run_sync(self.manager.shutdown_kernel)(now=True)
        run_sync(self.manager.cleanup_resources)()


#: What the early code adds when the notebook launches processes: the launcher's starter
#: (:func:`distlab.launch.prestart`) imports torch on the other core meanwhile, so the
#: first ``distlab.run`` does not wait for it.
PRESTART = "import distlab.launch; distlab.launch.prestart()"


def early_imports(nb) -> str:
    """The code sent to the kernel before the notebook runs: its first code cell's leading
    imports, executed in a namespace of their own, and :data:`PRESTART` if a cell calls
    ``distlab.run`` ("" when there is nothing to send)."""
    first = next((c for c in nb.cells if c.get("cell_type") == "code"), None)
    if first is None or is_graded(first):
        return ""
    imports = leading_imports(first.source)
    if not imports:
        return ""
    if calls_run(nb):
        imports += "\n" + PRESTART
    return f"exec({imports!r}, {{'get_ipython': get_ipython}})"


def calls_run(nb) -> bool:
    """True if a code cell of ``nb`` calls ``distlab.run`` (its kernel will need a starter)."""
    return any("distlab.run(" in c.source for c in nb.cells if c.get("cell_type") == "code")


def start_kernel(nb, folder: str) -> EarlyKernel:
    """Start ``nb``'s kernel in ``folder`` as nbclient starts it, send it
    :func:`early_imports` (without waiting for them), and return it."""
    from jupyter_client.session import Session
    from nbclient import NotebookClient

    starter = NotebookClient(nb, resources={"metadata": {"path": folder}})
    starter.km = starter.create_kernel_manager()
    use_private_sockets(starter.km)
    use_template_kernels(starter.km, nb)
    starter.start_new_kernel()
    # A session of its own: the kernel routes replies by the session id, and the Execute
    # step's client, made by the same manager, would otherwise share this one's.
    session = Session(
        key=starter.km.session.key, signature_scheme=starter.km.session.signature_scheme
    )
    client = starter.km.client(session=session)
    client.start_channels()
    code = early_imports(nb)
    if code:
        client.execute(code, silent=True, store_history=False, stop_on_error=False)
    return EarlyKernel(starter.km, client)


#: What a run folder of the child holds: the cut-down notebook (written by the caller), the
#: folder it runs in (copies of the files beside the learner's notebook), and what the
#: child writes back: the executed notebook and its test cells' points.
RUN_NOTEBOOK, RUN_WORK = "exercise.ipynb", "work"
RUN_EXECUTED, RUN_SCORES = "executed.ipynb", "scores.json"


def main(argv: list[str]) -> None:
    """The exercise runner's child, ``python -m distlab.grading.kernel RUN [RUN ...]
    [--timeout S]``: for each run folder in turn (see :data:`RUN_NOTEBOOK`), start a fresh
    kernel for its notebook in its ``work`` folder, with the early imports, and execute the
    notebook there as nbgrader would (:func:`distlab.grading.execute.execute_file`). nbgrader
    loads once, while the first kernel starts; every run has a kernel of its own, so a
    run sees nothing of the one before it."""
    import argparse

    import nbformat

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=None)
    args = parser.parse_args(argv)
    notebooks = [nbformat.read(run / RUN_NOTEBOOK, as_version=4) for run in args.runs]
    execute_file = None
    # several kernels, or one that starts processes: the kernels (and their worker starters)
    # fork from one template, which imports torch once (distlab.grading.forked_kernel)
    hosted = len(notebooks) > 1 or any(calls_run(nb) for nb in notebooks)
    with hosting(hosted):
        if hosted:  # nbgrader loads here while the template imports torch
            from distlab.grading.execute import execute_file
        for run, nb in zip(args.runs, notebooks, strict=True):
            work = run / RUN_WORK
            os.chdir(work)  # the Execute step runs the notebook in the current folder
            kernel = start_kernel(nb, str(work))
            if execute_file is None:
                from distlab.grading.execute import execute_file
            execute_file(
                run / RUN_NOTEBOOK, run / RUN_EXECUTED, run / RUN_SCORES, args.timeout, kernel
            )


if __name__ == "__main__":
    main(sys.argv[1:])
