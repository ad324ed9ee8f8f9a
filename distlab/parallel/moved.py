"""Module paths from before the families, and where each module lives now.

Until the package was grouped into families, every module of :mod:`distlab.parallel`
sat in one folder: ``distlab.parallel.fsdp``, ``distlab.parallel.training``, ... A
notebook from an older release (or a learner's own code) may still import them, so
each old path keeps working: importing it warns (a ``DeprecationWarning`` naming the
new path) and gives a module with the same objects as the new one. Old paths that are
now a family's folder (``comm``, ``data``, ``zero``, ``context``, ``moe``,
``checkpoint``) need no entry: the family's ``__init__`` hands on the names the old
module had. Classes that were renamed keep their old names through
:func:`distlab.core.renamed.old_names`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

#: old module (under ``distlab.parallel``) -> its module now
MOVED = {
    "accumulation": "data.accumulation",
    "agreement": "comm.agreement",
    "buckets": "comm.buckets",
    "checkpoint_files": "checkpoint.files",
    "comm_table": "compose.traffic",
    "comm_trace": "comm.trace",
    "context_gather": "context.gather",
    "ddp": "data.ddp",
    "ddp_timing": "data.ddp_timing",
    "flat": "zero.flat",
    "fsdp": "zero.fsdp",
    "memory": "precision.memory",
    "mesh": "compose.mesh",
    "mixed_precision": "precision.mixed_precision",
    "moe_gpt": "moe.gpt",
    "sync_batchnorm": "data.sync_batchnorm",
    "three_d": "compose.three_d",
    "trace": "data.step_trace",
    "training": "data.training",
    "ulysses": "context.ulysses",
}

PACKAGE = __name__.rpartition(".")[0]


def new_name(old: str) -> str | None:
    """``distlab.parallel.fsdp`` -> ``distlab.parallel.zero.fsdp``; None if it did not move."""
    prefix = PACKAGE + "."
    if not old.startswith(prefix) or old[len(prefix) :] not in MOVED:
        return None
    return prefix + MOVED[old[len(prefix) :]]


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path; loads it as a module holding the new module's names."""

    def find_spec(self, name, path=None, target=None):
        if new_name(name) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return None  # a fresh module object

    def exec_module(self, module: types.ModuleType) -> None:
        new = new_name(module.__name__)
        warnings.warn(
            f"{module.__name__} is now {new}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        target = importlib.import_module(new)
        names = {k: v for k, v in vars(target).items() if not k.startswith("__")}
        module.__dict__.update(names)
        module.__doc__ = f"Moved: this is {new}, under its old name."


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing ``distlab.parallel`` does)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
