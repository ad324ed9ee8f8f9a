"""Names from older releases that still import, with a warning naming today's.

A notebook from an older release (or a learner's own code) may import a class by the
name it had then: ``from distlab.parallel.pipeline import Schedule``. A module keeps
such a name working by ending with::

    __getattr__ = old_names(__name__, {"Schedule": PipelineSchedule})

Python calls a module's ``__getattr__`` only for a name the module does not define
(PEP 562), so today's names cost nothing; an old one gives today's object and a
``DeprecationWarning`` saying what to import instead. Module paths that moved are
:mod:`distlab.parallel.moved`'s.
"""

from __future__ import annotations

import warnings


def old_names(module: str, renamed: dict[str, object]):
    """A module ``__getattr__`` for ``module`` that answers each old name in ``renamed``
    with today's object (its ``__name__`` is today's name) and a warning, each time it is
    looked up."""

    def __getattr__(name: str):
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renamed[name]
        warnings.warn(
            f"{module}.{name} is now called {new.__name__}: import that name",
            DeprecationWarning,
            stacklevel=2,
        )
        return new

    return __getattr__
