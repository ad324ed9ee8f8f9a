"""nbgrader's Execute step, made to say how a cell ended when it did not end normally.

:func:`distlab.grading.whole.prepare_course` puts :class:`GuardedExecute` in place of
nbgrader's ``Execute`` in the course directory's config, and ``distlab grade --exercise``
runs its cut-down notebooks through :func:`execute_file` (in :mod:`distlab.grading.kernel`'s
child; it scores the test cells there too, with nbgrader's ``determine_grade``, so the
``distlab grade`` process needs no nbgrader of its own), so the learner's ``distlab
grade``, one exercise and the course's tests run notebooks the same way. Two ways out
change:

* **a cell runs past the timeout**: nbgrader interrupts it, and the cell showed the
  ``KeyboardInterrupt`` that the interrupt raised. Here its error reads
  ``TimeoutError: timed out after N s`` (the traceback is kept: it shows where it was).
* **the kernel dies** (``os._exit``, a crash in native code, out of memory): nbgrader
  stopped grading with a ``DeadKernelError``, and no exercise had a result. Here the cell
  gets the error ``DeadKernelError: the kernel died while running this cell``, a fresh
  kernel replays the cells before it (their first outputs are kept; cells that timed out
  are not run again), and the notebook goes on after it, so every other exercise is
  graded. After ``max_kernel_deaths`` deaths the cells left are marked as not run (an
  unrun test cell must not count as passed).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import nbformat
from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from nbgrader.utils import determine_grade
from traitlets import Integer, default

from distlab.grading.cells import TIMED_OUT, course_timeout, grade_id_of, is_graded
from distlab.grading.forked_kernel import use_template_kernels
from distlab.grading.sockets import use_private_sockets

KERNEL_DIED = (
    "the kernel died while running this cell (os._exit, a crash in native code, or out of memory)"
)


def error_output(ename: str, evalue: str, traceback: list[str] | None = None) -> NotebookNode:
    return NotebookNode(
        output_type="error",
        ename=ename,
        evalue=evalue,
        traceback=traceback or [f"{ename}: {evalue}"],
    )


class GuardedExecute(Execute):
    """nbgrader's Execute that reports timeouts and survives a dead kernel."""

    max_kernel_deaths = Integer(3, help="deaths after which the remaining cells are not run").tag(
        config=True
    )

    def create_kernel_manager(self):
        """nbclient's kernel manager, on sockets of its own
        (:func:`distlab.grading.sockets.use_private_sockets`)."""
        km = super().create_kernel_manager()
        use_private_sockets(km)
        use_template_kernels(km, self.nb)
        return km

    @default("shutdown_kernel")
    def _end_kernel_at_once(self) -> str:
        # nbclient's "graceful" waits about a second for the kernel's atexit hooks once
        # every cell has run; the outputs are read by then, and the workers a notebook
        # started end themselves when their parent (the kernel) goes.
        return "immediate"

    def preprocess(self, nb, resources=None, km=None):
        self._dead: list[int] = []  # cells that killed the kernel
        self._timed_out_cells: set[int] = set()  # not replayed: they would time out again
        self._resume_at = 0  # cells before this one ran already: replay them, keep outputs
        while True:
            try:
                return super().preprocess(nb, resources, km)
            except DeadKernelError:
                km = None  # a kernel given to us is dead: the next run starts one of its own
                index = self._running
                nb.cells[index].outputs.append(error_output("DeadKernelError", KERNEL_DIED))
                self._dead.append(index)
                self._resume_at = max(self._resume_at, index + 1)
                self.log.error("The kernel died while running cell %d", index)
                if len(self._dead) >= self.max_kernel_deaths:
                    return self._give_up(nb, index + 1)

    def _give_up(self, nb, start: int):
        evalue = f"not run: the kernel died {len(self._dead)} times before this cell"
        for cell in nb.cells[start:]:
            if cell.cell_type == "code":
                cell.outputs = [error_output("NotRun", evalue)]
        return nb, self.resources

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or index in self._dead:
            return cell, resources
        self._running = index
        self._timed_out = None
        if index < self._resume_at:
            if index in self._timed_out_cells:
                return cell, resources
            return self._replay(cell, resources, index)
        cell, resources = super().preprocess_cell(cell, resources, index)
        if self._timed_out is not None:
            _report_timeout(cell, self._timed_out)
            self._timed_out_cells.add(index)
        return cell, resources

    def _replay(self, cell, resources, index):
        """Run a cell again for the state it builds; its result is the first run's."""
        kept = cell.outputs, cell.get("execution_count")
        try:
            return super().preprocess_cell(cell, resources, index)
        finally:
            cell.outputs, cell.execution_count = kept

    async def _async_handle_timeout(self, timeout, cell=None):
        self._timed_out = timeout
        return await super()._async_handle_timeout(timeout, cell)


def _report_timeout(cell, timeout: int) -> None:
    """Replace what the interrupt raised by one error that says the cell timed out."""
    errors = [o for o in cell.outputs if o.output_type == "error"]
    traceback = list(errors[0].get("traceback", []))[:-1] if errors else []
    evalue = TIMED_OUT.format(timeout=timeout)
    cell.outputs = [o for o in cell.outputs if o.output_type != "error"]
    cell.outputs.append(
        error_output("TimeoutError", evalue, traceback + [f"TimeoutError: {evalue}"])
    )


def scores(nb) -> dict[str, float]:
    """grade id -> points of each test cell of an executed notebook, by nbgrader's own rule
    (``determine_grade``: an error or any output on stderr scores 0, else full points; a
    cell nbgrader leaves to a human grader scores 0 here, as in a report of the gradebook)."""
    points = {grade_id_of(c): determine_grade(c)[0] for c in nb.cells if is_graded(c)}
    return {grade_id: float(p or 0) for grade_id, p in points.items()}


def execute_file(
    given: str | os.PathLike,
    done: str | os.PathLike,
    scores_file: str | os.PathLike | None = None,
    timeout: int | None = None,
    kernel=None,
) -> None:
    """Execute the notebook ``given`` as nbgrader would (errors kept, timeouts and kernel
    deaths reported per cell), in the current folder, and write it to ``done``; with
    ``scores_file``, write the points of its test cells (:func:`scores`) there as JSON.

    ``kernel``: a :class:`distlab.grading.kernel.EarlyKernel` started for ``given`` in this
    folder, to run the notebook in (it is shut down afterwards); default a kernel of its own."""
    nb = nbformat.read(given, as_version=4)
    executor = GuardedExecute(
        timeout=timeout or course_timeout(), interrupt_on_timeout=True, allow_errors=True
    )
    if kernel is None:
        executor.preprocess(nb, {"metadata": {"path": os.getcwd()}})
    else:
        # the kernel answers once its early imports are done: they count as its start-up
        executor.startup_timeout = max(executor.startup_timeout, executor.timeout)
        try:
            executor.preprocess(nb, {"metadata": {"path": os.getcwd()}}, kernel.manager)
        finally:
            if executor.kc is not None and not executor.owns_km:
                executor.kc.stop_channels()
            kernel.shut_down()
    nbformat.write(nb, done)
    if scores_file:
        Path(scores_file).write_text(json.dumps(scores(nb)), encoding="utf-8")


def main(argv: list[str] | None = None, kernel=None) -> None:
    """``python -m distlab.grading.execute IN OUT [--timeout S] [--scores FILE]``:
    :func:`execute_file` (``kernel``: see there)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("given")
    parser.add_argument("done")
    parser.add_argument("--timeout", type=int, default=None)
    parser.add_argument("--scores", default=None)
    args = parser.parse_args(argv)
    execute_file(args.given, args.done, args.scores, args.timeout, kernel)


if __name__ == "__main__":
    main()
