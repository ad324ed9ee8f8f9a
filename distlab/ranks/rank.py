"""One rank of the interactive group: run the cells the notebook sends, in a namespace that
lives from one cell to the next.

:func:`serve` is the function distlab's launcher runs on every rank, as it runs any function
given to ``distlab.run``: the process group is initialised first, and what the rank prints
goes to the notebook line by line, tagged with its rank. Instead of returning, ``serve``
waits for requests (:mod:`distlab.ranks.messages`) and answers each:

* a cell runs as in a notebook: its statements, then its last expression, whose value is
  sent back as display data (a trailing ``;`` hides it, as in Jupyter). It is plain
  Python: IPython's ``%magics`` and ``!shell`` lines work only in the notebook's own cells;
* an error is caught and sent back with its traceback (from the cell's first frame down);
  the namespace keeps everything the cell did before it raised;
* Ctrl+C: a worker ignores SIGINT (the parent handles it for ``run``), except while a cell
  runs: then the notebook's interrupt raises ``KeyboardInterrupt`` in the cell. Python runs
  a signal handler only between bytecodes, so a rank waiting inside gloo's C++ code for a
  message that never comes does not see it (the notebook then restarts the ranks);
* figures: matplotlib draws here with its ``agg`` backend (the notebook's inline backend
  needs the kernel); after each cell every open figure is sent as a PNG and closed, as the
  inline backend does in a notebook.
"""

from __future__ import annotations

import ast
import base64
import io
import linecache
import os
import signal
import sys
import time
import traceback
import types

import cloudpickle

from distlab.launch.worker import JobChannel, failure, job_channel

from .messages import Cell, Display, Done, Gather, Gathered, Hello, Push

#: What every rank's namespace starts with (``device``: this rank's GPU under nccl, else
#: the CPU; ``display``: shows an object in the notebook, tagged with the rank).
PREDEFINED = ("rank", "world_size", "torch", "dist", "device", "display")


def serve(rank: int, world_size: int) -> None:
    """Answer the notebook's requests until it sends ``None`` (the launcher's job function)."""
    os.environ["MPLBACKEND"] = "agg"  # before the first cell can import matplotlib
    channel = job_channel()
    namespace = _namespace(rank, world_size, channel)
    channel.send(Hello(rank, os.getpid()))
    while True:
        try:
            request = channel.recv()
        except (EOFError, OSError):  # the notebook's kernel is gone
            _wait_for_the_end()
        if request is None:
            return
        channel.send(_answer(request, namespace, channel))


def _namespace(rank: int, world_size: int, channel: JobChannel) -> dict:
    import torch
    import torch.distributed as dist

    def display(*objects) -> None:
        """Show each object in the notebook, tagged with this rank."""
        _flush_output()
        for obj in objects:
            channel.send(Display(display_data(obj)))

    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    return {"__name__": "__main__", "rank": rank, "world_size": world_size, "torch": torch,
            "dist": dist, "device": device, "display": display}  # fmt: skip


def _wait_for_the_end() -> None:
    """The socket closed: the kernel died. The worker's own watch on its parent ends this
    process, and what it started, within a second (see ``distlab.launch.worker``)."""
    time.sleep(60)
    os._exit(1)


def _answer(request, namespace: dict, channel: JobChannel):
    if isinstance(request, Cell):
        return run_cell(request, namespace, channel)
    if isinstance(request, Gather):
        return _gather(request.name, namespace)
    if isinstance(request, Push):
        try:
            namespace[request.name] = cloudpickle.loads(request.payload)
        except Exception as exc:  # noqa: BLE001 - a module the kernel has and the rank lacks
            return Done(None, failure(exc), user_names(namespace))
        return Done(None, None, user_names(namespace))
    raise TypeError(f"a rank answers Cell, Push and Gather requests, not {request!r}")


def run_cell(cell: Cell, namespace: dict, channel: JobChannel) -> Done:
    """Run one cell in ``namespace``, as IPython would, and say how it went."""
    filename = f"<cell {cell.number}>"  # tracebacks show its lines (linecache has them)
    linecache.cache[filename] = (len(cell.code), None, cell.code.splitlines(True), filename)
    value = problem = None
    try:
        body, last = _compile(cell.code, filename)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl+C reaches the cell
        try:
            exec(body, namespace)  # noqa: S102 - running the learner's cell is the point
            result = eval(last, namespace) if last is not None else None
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if result is not None:
            value = display_data(result)
            _close_if_figure(result)
    except BaseException as exc:  # noqa: BLE001 - Ctrl+C and SystemExit included
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        problem = failure(exc)._replace(traceback=_cell_traceback(exc, filename))
    _flush_output()
    for figure in _open_figures():
        channel.send(Display(figure))
    return Done(value, problem, user_names(namespace))


def _compile(code: str, filename: str):
    """The cell's statements, and its last expression on its own (None if it ends with a
    statement, or with ``;``), compiled."""
    tree = ast.parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
        last = compile(ast.Expression(tree.body.pop().value), filename, "eval")
    return compile(tree, filename, "exec"), last


def _cell_traceback(exc: BaseException, filename: str) -> str:
    """The traceback from the cell's first frame down (this module's frames left out)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def user_names(namespace: dict) -> tuple[str, ...]:
    """The names a rank's cells defined (not the predefined ones, modules or _private)."""
    return tuple(
        sorted(
            name
            for name, value in namespace.items()
            if not name.startswith("_")
            and name not in PREDEFINED
            and not isinstance(value, types.ModuleType)
        )
    )


def _gather(name: str, namespace: dict) -> Gathered:
    if name not in namespace:
        return Gathered(problem=f"{name!r} is not defined")
    try:
        return Gathered(cloudpickle.dumps(namespace[name]))
    except Exception as exc:  # noqa: BLE001 - a lock, a generator, an open file
        return Gathered(problem=f"{name!r} cannot be sent ({type(exc).__name__}: {exc})")


# ------------------------------------------------------------ display data ---
def display_data(obj) -> dict:
    """``obj`` as Jupyter display data: IPython's formatters (every ``_repr_*_``), plus a
    PNG for a matplotlib figure; binary data as base64 text, as Jupyter sends it."""
    from IPython.core.formatters import DisplayFormatter  # 0.5 s: imported when first used

    formatter = DisplayFormatter()
    formatter.formatters["image/png"].for_type_by_name("matplotlib.figure", "Figure", _png)
    data, _ = formatter.format(obj)
    return {
        mime: base64.b64encode(content).decode() if isinstance(content, bytes) else content
        for mime, content in data.items()
    }


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def _open_figures() -> list[dict]:
    """Every figure the cell left open, as display data; then they are closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    shown = [display_data(pyplot.figure(number)) for number in pyplot.get_fignums()]
    pyplot.close("all")
    return shown


def _close_if_figure(value) -> None:
    """A figure shown as the cell's value is not shown again with the open ones."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    figure = sys.modules.get("matplotlib.figure")
    if pyplot is not None and figure is not None and isinstance(value, figure.Figure):
        pyplot.close(value)


def _flush_output() -> None:
    """Send the rest of a printed line (one without its newline yet) before what follows."""
    sys.stdout.flush()
    sys.stderr.flush()
