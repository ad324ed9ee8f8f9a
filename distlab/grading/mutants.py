"""Do the tests catch wrong answers? Grade plausible wrong solutions, quickly.

A test that passes the reference solution proves little; a test that fails a
set of *plausible wrong* solutions (an off-by-one, the other convention, a
missing factor, a call to the library function the exercise replaces, the
visible case hard-coded) proves it checks understanding. For one solution cell
``S`` of a source notebook this module:

1. slices the notebook to the cells its dependent test cells need
   (:func:`distlab.grading.slicing.needed_cells`), and splits them into a
   *prefix* that does not depend on ``S`` and the cells that do;
2. in the notebook's one kernel (:class:`Kernel`), runs the prefix, then for
   each variant of ``S`` (the solution, the released stub, every mutant, and
   the solution again, to show that no variant left the kernel in a state that
   changes the verdict) runs ``S`` and the cells that depend on it;
3. reports, per variant, which dependent test cells raised, and what a cell of the
   caller's (``after``), run after the variant's cells, showed: the suite runs
   ``distlab.check`` there, to compare its points with ``distlab grade --exercise``'s
   without a kernel and a prefix of its own.

A mutant is *caught* when at least one test cell that depends on it raises,
so it earns less than full marks, as in the whole-notebook grade.

Mutants are kept as data, one module per notebook, with a ``MUTANTS`` dict:
``{solution grade id: [(what is wrong, the cell's whole source), ...]}``
(``tests/mutants/``). ``python benchmarks/grading_mutants.py`` prints the
table; ``tests/test_grading_mutants.py`` fails on a mutant that is not caught.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from distlab.core.course import released_notebook, source_notebook
from distlab.grading.cells import failure, grade_id_of, is_graded
from distlab.grading.forked_kernel import use_template_kernels
from distlab.grading.slicing import cell_names, needed_cells
from distlab.grading.sockets import use_private_sockets


@dataclass(frozen=True)
class Verdict:
    """What the dependent test cells did with one variant of a solution cell."""

    variant: str  # "solution", "stub", "solution again", or the mutant's description
    failed: tuple[str, ...]  # grade ids of the dependent test cells that raised
    messages: tuple[str, ...]  # their errors, "ExcType: first line"
    after: tuple = ()  # the outputs of the caller's ``after`` cell, run after the variant

    @property
    def caught(self) -> bool:
        return bool(self.failed)


def depends_on(sources: list[str], start: int) -> set[int]:
    """Indexes of the cells after ``start`` that use, directly or through other cells, a
    name that cell ``start`` defines. A name a dependent cell binds by an import is the
    library's whatever the solution: it passes nothing on (a test cell that imports what
    it uses does not make every later cell using those names depend on the solution)."""
    names = [cell_names(s) for s in sources]
    tainted, result = set(names[start].defines), set()
    for index in range(start + 1, len(sources)):
        if names[index].uses & tainted:
            result.add(index)
            tainted |= names[index].defines - names[index].imports
    return result


@dataclass
class MutationPlan:
    """The cells to run for solution cell ``solution_id`` of a notebook."""

    cells: list  # code cells of the source notebook
    solution: int  # index of the solution cell in ``cells``
    tests: list[int]  # dependent graded test cells
    prefix: list[int]  # needed cells that do not depend on the solution cell
    per_variant: list[int]  # the solution cell and the needed cells that depend on it


def plan(source_nb, solution_id: str) -> MutationPlan:
    cells = [c for c in source_nb.cells if c.cell_type == "code"]
    sources = [c.source for c in cells]
    solution = next(i for i, c in enumerate(cells) if grade_id_of(c) == solution_id)
    dependent = depends_on(sources, solution)
    tests = [i for i in sorted(dependent) if is_graded(cells[i])]
    if not tests:
        raise ValueError(f"no graded test cell uses what solution cell {solution_id!r} defines")
    needed = needed_cells(sources, tests)
    prefix = [i for i in needed if i != solution and i not in dependent]
    per_variant = [i for i in needed if i == solution or i in dependent]
    return MutationPlan(cells, solution, tests, prefix, per_variant)


def _error(outputs) -> str | None:
    """Why a test cell scores 0 under nbgrader's rule (an error, or output on stderr)."""
    why = failure(outputs)
    return why[:300] if why else None


class Kernel:
    """One Jupyter kernel that runs cells one at a time and keeps what they define.

    A notebook's mutation check uses one kernel for all its solution cells: a kernel and its
    first imports (torch, the launcher's worker starter) cost seconds of CPU, more than most
    variants. Sharing it changes no verdict: every solution cell's prefix runs again before
    its variants (so it sees what a fresh kernel would), each exercise ends with its
    solution again (so the next one starts from the solved state, as in the whole-notebook
    grade), and the solution must pass both before and after the mutants."""

    def __init__(self, cwd: str, timeout: int = 120, notebook=None):
        import nbformat
        from nbclient import NotebookClient

        self._notebook = notebook  # the notebook whose cells it runs (how to start it)

        self.nb = nbformat.v4.new_notebook()
        self.nb.metadata = {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        }
        self.client = NotebookClient(
            self.nb, timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
            kernel_name="python3", resources={"metadata": {"path": cwd}},
        )  # fmt: skip
        self._context = None

    def __enter__(self) -> Self:
        self.client.km = self.client.create_kernel_manager()
        use_private_sockets(self.client.km)
        use_template_kernels(self.client.km, self._notebook or self.nb)
        self._context = self.client.setup_kernel()
        self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)

    def run(self, source: str) -> list:
        """Run one cell; return its outputs."""
        import nbformat

        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        return cell.get("outputs", [])


def check_cell(exercise: str | int, notebook: str) -> str:
    """The source of a cell that runs the learner's ``distlab.check(exercise)`` in a
    :class:`Kernel` (not recorded: a test's or a benchmark's check) and prints its result
    as one line, ``CHECK {json}``, which :func:`check_result` reads back."""
    return (
        "import json as _json, time as _time, distlab as _distlab\n"
        "_started = _time.perf_counter()\n"
        f"_result = _distlab.check({exercise!r}, notebook={notebook!r}, record=False)\n"
        'print("CHECK " + _json.dumps({"points": _result.points,\n'
        '    "failure": _result.grade.exercises[0].failure, "test_s": _result.seconds,\n'
        '    "wall_s": _time.perf_counter() - _started}))'
    )


def check_result(outputs) -> dict:
    """What a :func:`check_cell` printed: ``points``, ``failure`` (None when it passed),
    ``test_s`` (the test cell's seconds) and ``wall_s`` (the whole call's). Raises
    ``RuntimeError`` when the cell raised or printed no result."""
    for output in outputs:
        if output.get("output_type") == "stream" and "CHECK {" in output.get("text", ""):
            return json.loads(output["text"].split("CHECK ", 1)[1].splitlines()[0])
        if output.get("output_type") == "error":
            raise RuntimeError(f"the check raised {output['ename']}: {output['evalue']}")
    raise RuntimeError(f"no check result in {outputs}")


def run_variants(
    plan: MutationPlan, variants: list[tuple[str, str]], kernel: Kernel, after: str = ""
) -> list[Verdict]:
    """Run the prefix once and each ``(name, source of the solution cell)`` variant after it,
    in ``kernel``; return what the dependent test cells did with each, and what the cell
    ``after`` (if any) showed when run after them."""
    verdicts = []
    for index in plan.prefix:
        kernel.run(plan.cells[index].source)
    for name, source in variants:
        failed, messages = [], []
        for index in plan.per_variant:
            text = source if index == plan.solution else plan.cells[index].source
            error = _error(kernel.run(text))
            if index in plan.tests and error:
                failed.append(grade_id_of(plan.cells[index]))
                messages.append(error)
        shown = tuple(kernel.run(after)) if after else ()
        verdicts.append(Verdict(name, tuple(failed), tuple(messages), shown))
    return verdicts


def load_module(path: str | Path):
    """A mutants module (``tests/mutants/mNN_topic.py``): ``ASSIGNMENT`` and ``MUTANTS``."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mutant_source(solution: str, change) -> str:
    """A mutant's cell source: ``change`` itself, or ``solution`` with each ``(old, new)``
    of the list ``change`` replaced once (ValueError if an ``old`` is not there)."""
    if isinstance(change, str):
        return change
    for old, new in change:
        if old not in solution:
            raise ValueError(f"a mutant replaces text the solution cell does not have: {old!r}")
        solution = solution.replace(old, new, 1)
    return solution


#: The name of a variant that must earn full marks: another correct answer
#: (``ALTERNATIVES`` of a mutants module), run among the mutants.
CORRECT = "correct: "


def check_solution_cell(
    source_nb, released_nb, solution_id: str, mutants, kernel: Kernel, after: str = "",
    alternatives=(),
):  # fmt: skip
    """Verdicts for the solution, the released stub, each mutant, each correct alternative
    (named ``CORRECT + what``) and the solution again."""
    cells = {grade_id_of(c): c for c in released_nb.cells if grade_id_of(c)}
    the_plan = plan(source_nb, solution_id)
    solution = the_plan.cells[the_plan.solution].source
    variants = [("solution", solution), ("stub", cells[solution_id].source)]
    variants += [(what, mutant_source(solution, change)) for what, change in mutants]
    variants += [(CORRECT + what, mutant_source(solution, change)) for what, change in alternatives]
    variants.append(("solution again", solution))
    return the_plan, run_variants(the_plan, variants, kernel, after)


def check_notebook(
    root: Path, mutants_file: Path, cwd: str, after: dict[str, str] | None = None
) -> dict[str, list[Verdict]]:
    """Verdicts for every solution cell that ``mutants_file`` has mutants for, in notebook
    order, all in one kernel (see :class:`Kernel`); ``after`` maps a solution cell's grade id
    to a cell run after each of its variants (:attr:`Verdict.after`). A module's optional
    ``ALTERNATIVES`` (same form as ``MUTANTS``) are other correct answers: their verdicts'
    names start with :data:`CORRECT`, and they must earn full marks."""
    import nbformat

    module = load_module(mutants_file)
    name = module.ASSIGNMENT
    source = nbformat.read(source_notebook(root, name), as_version=4)
    released = nbformat.read(released_notebook(root, name), as_version=4)
    order = [grade_id_of(c) for c in source.cells if grade_id_of(c) in module.MUTANTS]
    unknown = sorted(set(module.MUTANTS) - set(order))
    if unknown:
        raise ValueError(f"{mutants_file}: no solution cell {unknown} in the source of {name}")
    with Kernel(cwd, notebook=source) as kernel:
        return {
            solution_id: check_solution_cell(
                source,
                released,
                solution_id,
                module.MUTANTS[solution_id],
                kernel,
                (after or {}).get(solution_id, ""),
                getattr(module, "ALTERNATIVES", {}).get(solution_id, ()),
            )[1]
            for solution_id in order
        }
