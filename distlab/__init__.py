"""distlab: learn distributed deep-learning training by running it for real.

``import distlab`` is cheap: the calculators (:mod:`distlab.calc`) and the
simulator (:mod:`distlab.sim`) are pure Python, and torch is imported only
when you touch something that needs it (the launcher, the collectives, the
parallel training code).

The two entry points most people need::

    import distlab
    results = distlab.run(fn, world_size=4)   # fn(rank, world_size) on 4 processes
    rank, world_size = distlab.init()         # inside a script started by torchrun

In a notebook, ``%load_ext distlab`` adds ``%ranks`` and ``%%ranks``: N ranks that keep
their namespaces between cells, to explore on (:mod:`distlab.ranks`);
``distlab.check("ring-all-reduce")`` (or ``distlab.check()`` under the exercise) runs an
exercise's tests, hidden ones included, on what the kernel holds now
(:mod:`distlab.grading.check`), and ``distlab.progress_table()`` shows the grades, checks
and flashcards due per notebook (:mod:`distlab.commands.progress`).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAUNCH_NAMES = {"run", "init", "shutdown", "RankError", "LaunchTimeoutError"}
_ELSEWHERE = {  # name -> the module that defines it, imported when the name is first used
    "check": "distlab.grading.check",
    "progress_table": "distlab.commands.progress",
}
_SUBMODULES = {"calc", "sim", "collectives", "parallel", "placement", "viz", "launch", "ranks"}

__all__ = [
    "LaunchTimeoutError",
    "Layout",
    "RankError",
    "calc",
    "check",
    "collectives",
    "init",
    "launch",
    "parallel",
    "placement",
    "progress_table",
    "ranks",
    "run",
    "shutdown",
    "sim",
    "viz",
]


def __getattr__(name: str):
    # Lazy imports keep `import distlab` (and `import distlab.calc`) free of torch.
    if name in _LAUNCH_NAMES:
        launch = importlib.import_module("distlab.launch")
        return getattr(launch, name)
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    if name == "Layout":  # the one description of a run's parallel layout
        return importlib.import_module("distlab.core.layout").Layout
    if name in _SUBMODULES:
        return importlib.import_module(f"distlab.{name}")
    raise AttributeError(f"module 'distlab' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext distlab``: the ``%ranks`` and ``%%ranks`` magics (:mod:`distlab.ranks`,
    imported only now, so that ``import distlab`` stays light)."""
    importlib.import_module("distlab.ranks").load_ipython_extension(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext distlab``: stop the ranks."""
    importlib.import_module("distlab.ranks").unload_ipython_extension(ipython)
