"""distlab: learn distributed deep-learning training by running it for real.

``import distlab`` is cheap: the calculators (:mod:`distlab.calc`) and the
simulator (:mod:`distlab.sim`) are pure Python, and torch is imported only
when you touch something that needs it (the launcher, the collectives, the
parallel training code).

The two entry points most people need::

    import distlab
    results = distlab.run(fn, world_size=4)   # fn(rank, world_size) on 4 processes
    rank, world_size = distlab.init()         # inside a script started by torchrun
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAUNCH_NAMES = {"run", "init", "shutdown", "RankError", "LaunchTimeoutError"}
_SUBMODULES = {"calc", "sim", "collectives", "parallel", "placement", "viz", "launch"}

__all__ = [
    "LaunchTimeoutError",
    "Layout",
    "RankError",
    "calc",
    "collectives",
    "init",
    "launch",
    "parallel",
    "placement",
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
    if name == "Layout":  # the one description of a run's parallel layout
        return importlib.import_module("distlab.core.layout").Layout
    if name in _SUBMODULES:
        return importlib.import_module(f"distlab.{name}")
    raise AttributeError(f"module 'distlab' has no attribute {name!r}")
