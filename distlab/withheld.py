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

Rebinding names cannot catch a reference taken before the block: a default argument
(``def f(x, _ref=sim.busbw)``), a ``functools.partial``, a dict or list of functions built
at cell level, a subclass whose methods call originals saved earlier, a module reloaded
with ``importlib.reload``, or a copy of the library's code (``inspect.getsource`` and
``exec``). So the block also watches what runs (:class:`_Watch`, ``sys.settrace`` in this
thread and in threads started inside it): any execution of a withheld function's code, or
of code with the same bytecode, constants and names (a copy or a reloaded module's), is a
shortcut however it was reached. It is reported when the block ends, by name, as an
:class:`ExerciseShortcut`, so the learner's code cannot hide it by catching the error.
Functions, methods and classes (every method of a class) can be withheld.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import types
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


def _code_objects(fn: object) -> list[types.CodeType]:
    """The code a withheld function, method or class runs (a class: each of its methods).

    A decorated function is watched by the function it wraps (``__wrapped__``): the
    decorator's wrapper code is shared by every function it decorates (torch.distributed's
    collectives share one logging wrapper), so running it says nothing. For the same
    reason a closure's code (shared by every function its factory made) is left to the
    rebinding, as is a C function."""
    if isinstance(fn, type):
        members = []
        for member in vars(fn).values():
            if isinstance(member, property):
                members += [f for f in (member.fget, member.fset, member.fdel) if f]
            else:
                members.append(member)
        return [code for member in members for code in _code_objects(member)]
    if isinstance(fn, (staticmethod, classmethod, types.MethodType)):
        fn = fn.__func__
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or code.co_freevars:
        return []
    return [code]


def _fingerprint(code: types.CodeType) -> tuple:
    """What a copy of ``code`` shares with it wherever it was compiled: bytecode, names and
    constants (the docstring among them; nested code by its own fingerprint), not the file
    or the line numbers."""
    consts = tuple(
        _fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts
    )
    return (code.co_name, code.co_code, code.co_names, code.co_varnames, consts)


def _copy_detectable(code: types.CodeType) -> bool:
    """Whether a run of code with ``code``'s fingerprint can only be a copy: it has a
    docstring, or is long. A learner's own two-line function, written from the formula, may
    compile to the same bytes as an undocumented library one-liner; it must not be blamed."""
    documented = bool(code.co_consts) and isinstance(code.co_consts[0], str)
    return documented or len(code.co_code) >= 120


class _Watch:
    """Records every run of the withheld code (or a copy of it) while it is installed:
    ``sys.settrace`` in this thread, ``threading.settrace`` for threads started meanwhile.
    The trace function looks only at calls (it returns no local tracer), and passes each
    event on to a tracer that was already installed (a debugger)."""

    def __init__(self, functions, calls: list[str]):
        # by identity (code objects compare equal by value, so two compilations of one
        # short formula would match), and copies by fingerprint
        self.codes = []  # kept alive while their ids are keys
        self.names: dict[object, str] = {}
        for fn in functions:
            for code in _code_objects(fn):
                self.codes.append(code)
                self.names[id(code)] = _qualified_code(fn, code)
                if _copy_detectable(code):
                    self.names[_fingerprint(code)] = self.names[id(code)]
        self.calls = calls
        self.ran: list[str] = []

    def _name_of(self, code: types.CodeType) -> str | None:
        """The withheld function ``code`` is (or copies), or None."""
        return self.names.get(id(code)) or self.names.get(_fingerprint(code))

    def _tracer(self) -> Callable:
        """The trace function. It runs on every Python call inside the block, so it is a
        plain function over local names (measured per traced call: 0.63 us, against 0.97 us
        for the method it replaced and 0.55 us for a trace function that does nothing),
        and each code object is looked at once: ``innocent`` keeps, by id, the code objects
        that are neither a withheld function nor a copy of one (the object itself, so that a
        recycled id cannot mislead)."""
        innocent: dict[int, types.CodeType] = {}
        name_of, ran, calls, previous = self._name_of, self.ran, self.calls, self._previous

        def trace(frame, event, arg):
            if event == "call":
                code = frame.f_code
                if innocent.get(id(code)) is not code:
                    name = name_of(code)
                    if name is None:
                        innocent[id(code)] = code
                    elif name not in ran:
                        ran.append(name)
                        calls.append(name)
            return previous(frame, event, arg) if previous is not None else None

        return trace

    def __enter__(self):
        self._previous = sys.gettrace()
        self._previous_threads = threading.gettrace()
        trace = self._tracer()
        sys.settrace(trace)
        threading.settrace(trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._previous)
        threading.settrace(self._previous_threads)


def _qualified_code(fn: object, code: types.CodeType) -> str:
    if isinstance(fn, type):
        return f"{_qualified(fn)}.{code.co_name}"
    return _qualified(fn)


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
    watch = _Watch(functions, calls)
    try:
        for owner, attr, fn in bindings:
            setattr(owner, attr, stand_ins[id(fn)])
        with watch:
            try:
                yield calls
            except ExerciseShortcut:
                raise  # a withheld name was called: the stand-in already said so
            except BaseException as error:
                if watch.ran:
                    raise _ran_anyway(exercise, watch.ran) from error
                raise
    finally:
        for owner, attr, fn in bindings:
            setattr(owner, attr, fn)
    if watch.ran:
        raise _ran_anyway(exercise, watch.ran)


def _ran_anyway(exercise: str, names: list[str]) -> ExerciseShortcut:
    return ExerciseShortcut(
        f"exercise {exercise!r} asks you to write this yourself: your code ran "
        f"{', '.join(names)}, which the grader withholds while it checks your code, reached "
        "without its name (a default argument, functools.partial, a saved reference, a "
        "reloaded module or a copy of its code)"
    )


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
