"""Hide a library function while a test checks the learner's version of it.

An exercise that asks for ``busbw`` is not an exercise if the learner can
``return sim.busbw(...)``: the hidden test would compare the library with
itself. A test cell therefore checks the learner's function inside
``withheld``::

    want = sim.busbw("all_reduce", 8, 10**9, 1e-2)          # the reference, outside
    with withheld(sim.busbw, sim.algbw, exercise="bandwidths"):
        got = bandwidths("all_reduce", 8, 10**9, 1e-2)      # the learner's, inside
    expect_close("busbw", got[1], want)

Inside the block every name bound to a withheld function, in the notebook
(``__main__``), in every loaded ``distlab`` and ``torch.distributed`` module
(and torch's C bindings of it) and on their classes, points to a stand-in that raises :class:`ExerciseShortcut`
saying which function the exercise asks the learner to write. Everything is
put back on the way out, also when the check fails. Only what the exercise
replaces should be withheld: library code that calls a withheld function
fails too while the block runs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

_SCANNED = ("__main__", "distlab", "torch.distributed", "torch._C._distributed_c10d")


class ExerciseShortcut(RuntimeError):
    """The learner's function called a library function that the exercise asks them to write."""


def _qualified(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"


def _stand_in(fn: Callable, exercise: str, calls: list[str]) -> Callable:
    name = _qualified(fn)

    def withheld_function(*args, **kwargs):
        calls.append(name)
        raise ExerciseShortcut(
            f"exercise {exercise!r} asks you to write this yourself: your function called "
            f"{name}, which the grader hides while it checks your code"
        )

    withheld_function.__name__ = getattr(fn, "__name__", "withheld_function")
    withheld_function.__doc__ = f"Withheld while exercise {exercise!r} is graded."
    return withheld_function


def _scanned_modules() -> list:
    return [
        module
        for name, module in list(sys.modules.items())
        if module is not None and any(name == p or name.startswith(p + ".") for p in _SCANNED)
    ]


def _bindings(targets: dict[int, Callable]) -> list[tuple[object, str, Callable]]:
    """(namespace object, attribute, function) for every binding of a target function."""
    found, seen_classes = [], set()
    for module in _scanned_modules():
        for attr, value in list(vars(module).items()):
            if id(value) in targets and value is targets[id(value)]:
                found.append((module, attr, value))
            elif issubclass(type(value), type) and id(value) not in seen_classes:
                # type(value), not isinstance: isinstance may read value.__class__, and some
                # module attributes warn when read (torch.distributed.reduce_op)
                seen_classes.add(id(value))
                for cls_attr, member in list(vars(value).items()):
                    if id(member) in targets and member is targets[id(member)]:
                        found.append((value, cls_attr, member))
    return found


@contextlib.contextmanager
def withheld(*functions: Callable, exercise: str) -> Iterator[list[str]]:
    """Within the block, calling any of ``functions`` raises :class:`ExerciseShortcut`.

    Yields the list of withheld functions called (each by its qualified name), so a
    test can say so even if the learner's code caught the error.
    """
    if not functions:
        raise ValueError("withheld() needs at least one function to hide")
    for fn in functions:
        if not callable(fn):
            raise TypeError(f"withheld() hides functions, got {type(fn).__name__}: {fn!r}")
    calls: list[str] = []
    targets = {id(fn): fn for fn in functions}
    stand_ins = {id(fn): _stand_in(fn, exercise, calls) for fn in functions}
    bindings = _bindings(targets)
    try:
        for owner, attr, fn in bindings:
            setattr(owner, attr, stand_ins[id(fn)])
        yield calls
    finally:
        for owner, attr, fn in bindings:
            setattr(owner, attr, fn)


def expect(condition: bool, what: str, got, want, hint: str = "") -> None:
    """Raise an ``AssertionError`` that says what was compared, both values, and a hint."""
    if not condition:
        message = f"{what}: yours is {got!r}, expected {want!r}"
        raise AssertionError(message + (f". {hint}" if hint else ""))


def expect_close(what: str, got, want, *, rel_tol: float = 1e-9, abs_tol: float = 0.0,
                 hint: str = "") -> None:  # fmt: skip
    """:func:`expect` for numbers equal within ``rel_tol``/``abs_tol`` (``math.isclose``)."""
    import math

    ok = isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol)
    if not ok and isinstance(got, (int, float)) and want:
        hint = f"{hint} (ratio yours/expected = {got / want:.4g})".strip()
    expect(ok, what, got, want, hint)
