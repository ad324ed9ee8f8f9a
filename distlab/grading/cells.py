"""What a graded notebook's cells say: nbgrader's metadata, and why a test cell failed.

nbgrader marks a test cell with ``metadata.nbgrader`` (``grade: true``, a ``grade_id``,
``points``); it scores the cell 0 when the cell raises or writes to stderr. The helpers
here read a cell as a dict (an ``nbformat`` node is one), so this module needs neither
nbformat nor nbgrader.
"""

from __future__ import annotations

import re

from distlab.core.course import CONFIG_FILE, find_course_root

MISSING_CELL = (
    "this test cell is missing from your notebook (deleted?), so its tests did not run: "
    "copy it back from the released notebook"
)
KERNEL_DIED = (
    "kernel died while running {title} (os._exit, a crash in native code, or out of memory); "
    "the cells after it ran in a fresh kernel"
)
MESSAGE_LINES = 30  # lines of a failing check's message shown in the report
TIMED_OUT = "timed out after {timeout} s (an endless loop, or a wait that never ends?)"
DEFAULT_TIMEOUT = 120  # seconds a cell may run when the course config does not say
#: how nbgrader marks the hidden part of a test cell in the source notebooks
HIDDEN_MARK = "### BEGIN HIDDEN TESTS"


def course_timeout(root=None) -> int:
    """The course config's ``Execute.timeout`` (seconds a cell may run)."""
    config = (find_course_root(root) / CONFIG_FILE).read_text(encoding="utf-8")
    for line in config.splitlines():
        if line.replace(" ", "").startswith("c.Execute.timeout="):
            return int(line.split("=", 1)[1].split("#")[0])
    return DEFAULT_TIMEOUT


def grade_id_of(cell) -> str | None:
    """The cell's nbgrader ``grade_id``, None if it has none."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def is_graded(cell) -> bool:
    """A code cell that nbgrader scores (a test cell)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and cell.get("cell_type") == "code"


def is_solution(cell) -> bool:
    """A cell the learner writes in (nbgrader's solution cell)."""
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


def is_restored(cell) -> bool:
    """A code cell that ``nbgrader autograde`` takes from the course, whatever the learner's
    copy holds: a test cell (hidden tests included), or a read-only cell (``locked``)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    locked = bool(meta.get("locked")) and not meta.get("solution")
    return cell.get("cell_type") == "code" and (is_graded(cell) or locked)


def graded_cells(nb) -> list:
    """The notebook's test cells, in order."""
    return [c for c in nb.cells if is_graded(c)]


def autograde_points(outputs, max_points: float) -> float:
    """A test cell's points from its outputs, by nbgrader's rule for an autograded code cell
    (``nbgrader.utils.determine_grade``; written out here because importing nbgrader costs
    seconds and :func:`distlab.check` must answer in one): the first error or stderr output
    scores 0; an ``execute_result`` before any scores its value if that is a number from 0
    to ``max_points`` (ValueError above it, full points otherwise); else full points."""
    for output in outputs:
        kind = output.get("output_type")
        if kind == "error" or (kind == "stream" and output.get("name") == "stderr"):
            return 0.0
        if kind == "execute_result":
            text = output.get("data", {}).get("text/plain")
            if isinstance(text, list):
                if len(text) > 1:
                    return float(max_points)
                text = text[0]
            try:
                value = float(text)
            except (TypeError, ValueError):
                return float(max_points)
            if value > max_points:
                raise ValueError("partial credit cannot be greater than maximum points for cell")
            return value if value >= 0 else float(max_points)
    return float(max_points)


def failure(outputs) -> str | None:
    """``ExcType: message`` of a cell's error; for a failed rank, the rank's own last line too.
    A test cell that wrote to stderr fails too (nbgrader gives it no points): say so."""
    for output in outputs:
        if output.get("output_type") != "error":
            continue
        value = str(output.get("evalue", "")).strip()
        lines = [line for line in value.splitlines() if line.strip()]
        head = f"{output.get('ename', 'Error')}: {lines[0] if lines else ''}".rstrip(": ")
        if output.get("ename") == "RankError" and len(lines) > 1:
            return (
                f"{head}\n{lines[-1].strip()}"  # the rank's traceback: its last line is the cause
            )
        return "\n".join([head, *lines[1:MESSAGE_LINES]])  # a check's whole message
    for output in outputs:
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            text = [line for line in str(output.get("text", "")).splitlines() if line.strip()]
            return "\n".join(
                ["the test cell wrote to stderr, which nbgrader counts as a failure:", *text[:5]]
            )
    return None


def kernel_deaths(executed) -> list[str]:
    """A line for each cell other than a test cell that killed the kernel."""
    return [
        f"the kernel died while running cell {index + 1} (not a test cell); "
        "the cells after it ran in a fresh kernel"
        for index, cell in enumerate(executed.cells)
        if not is_graded(cell)
        and any(o.get("ename") == "DeadKernelError" for o in cell.get("outputs", []))
    ]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_IPYTHON_FRAME = re.compile(r"^(Cell In\[\d+\]), line \d+, in (\w+)")
_IPYTHON_FILE_FRAME = re.compile(r"^File ([^\n]*?):\d+, in (\w+)")
_PYTHON_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+, in (\S+)$', re.MULTILINE)


def _is_notebook_code(where: str) -> bool:
    """A frame in code the learner's notebook defined: an IPython cell, or a function
    defined in a cell and shipped to a worker (its file is ``/tmp/ipykernel_<pid>/...``)."""
    return where.startswith("Cell In[") or "ipykernel_" in where


def raised_in(outputs) -> str | None:
    """The function of the learner's notebook that raised a cell's error: the innermost
    frame in notebook code (for a :class:`distlab.RankError`, of the failing rank), or
    None if the error was raised by the test cell itself."""
    for output in outputs:
        if output.get("output_type") != "error":
            continue
        frames = []  # (where, function), outermost first
        for entry in output.get("traceback", []):
            first_line = _ANSI.sub("", entry).splitlines()[0] if entry.strip() else ""
            match = _IPYTHON_FRAME.match(first_line) or _IPYTHON_FILE_FRAME.match(first_line)
            if match:
                frames.append((match.group(1), match.group(2)))
        if output.get("ename") == "RankError":  # the rank's traceback is in the message
            frames += _PYTHON_FRAME.findall(str(output.get("evalue", "")))
        notebook = [name for where, name in frames if _is_notebook_code(where)]
        return notebook[-1] if notebook and notebook[-1] != "<module>" else None
    return None
