"""One name per idea: the collective algorithm is a ``CollectiveSchedule``, the pipeline
schedule a ``PipelineSchedule``; both were once called ``Schedule``.

A learner's notebook from an older release still does ``from distlab.parallel.pipeline import
Schedule``: each module that exported the old name still gives it, as the new class, with a
``DeprecationWarning`` that names the new name. No module defines or exports ``Schedule``.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import nbformat
import pytest

from distlab.core.collective_schedule import CollectiveSchedule
from distlab.core.pipeline_schedule import PipelineSchedule

DISTLAB = Path(__file__).resolve().parent.parent / "distlab"
OLDER_08 = (
    Path(__file__).parent / "data" / "older-releases" / "08-pipeline-parallelism-15d0b54.ipynb"
)

#: module that exported ``Schedule`` -> the class that name meant there
OLD_EXPORTS = {
    "distlab.core.collective_schedule": CollectiveSchedule,
    "distlab.collectives": CollectiveSchedule,
    "distlab.core.pipeline_schedule": PipelineSchedule,
    "distlab.parallel.pipeline": PipelineSchedule,
    "distlab.calc.pipeline": PipelineSchedule,
}


@pytest.mark.parametrize("module_name", OLD_EXPORTS)
def test_the_old_name_still_imports_as_the_new_class_and_warns(module_name):
    module, new = importlib.import_module(module_name), OLD_EXPORTS[module_name]
    with pytest.warns(DeprecationWarning, match=rf"\b{new.__name__}\b") as record:
        old = module.Schedule
    assert old is new
    assert record[0].filename == __file__  # the warning points at the line that used the name
    assert "Schedule" not in vars(module) and "Schedule" not in getattr(module, "__all__", ())
    assert new.__name__ in getattr(module, "__all__", (new.__name__,))
    with pytest.raises(AttributeError, match="no attribute 'Shedule'"):
        module.Shedule  # noqa: B018 - other missing names are still missing


def test_an_older_copy_of_notebook_08_still_imports_schedule():
    """The import statement of the older release's setup cell, as the learner runs it."""
    setup = nbformat.read(OLDER_08, as_version=4).cells[1].source
    (statement,) = [
        node
        for node in ast.parse(setup).body
        if isinstance(node, ast.ImportFrom) and node.module == "distlab.parallel.pipeline"
    ]
    assert "Schedule" in [alias.name for alias in statement.names]
    namespace: dict = {}
    code = compile(ast.Module([statement], []), "<notebook 08>", "exec")
    with pytest.warns(DeprecationWarning, match="PipelineSchedule"):
        exec(code, namespace)  # noqa: S102 - the learner's import statement is the point
    assert namespace["Schedule"] is PipelineSchedule
    plan = namespace["Schedule"].parse("rank 0: 0F0 0B0")
    assert isinstance(plan, PipelineSchedule)


def test_the_new_names_import_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module_name, new in OLD_EXPORTS.items():
            assert getattr(importlib.import_module(module_name), new.__name__) is new


def _old_name_uses(path: Path) -> list[str]:
    """Where the module at ``path`` defines, imports, assigns or exports ``Schedule``."""
    tree, found = ast.parse(path.read_text(), str(path)), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Schedule":
            found.append(f"line {node.lineno}: class Schedule")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [alias.asname or alias.name for alias in node.names]
            if "Schedule" in bound:
                found.append(f"line {node.lineno}: imports Schedule")
        elif isinstance(node, ast.Name) and node.id == "Schedule":
            found.append(f"line {node.lineno}: uses the name Schedule")
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        exports = isinstance(target, ast.Name) and target.id == "__all__"
        if exports and "Schedule" in ast.literal_eval(node.value):
            found.append(f"line {node.lineno}: __all__ lists Schedule")
    return found


def test_no_module_of_distlab_defines_or_exports_a_class_called_schedule():
    uses = {
        str(path.relative_to(DISTLAB.parent)): found
        for path in sorted(DISTLAB.rglob("*.py"))
        if (found := _old_name_uses(path))
    }
    assert uses == {}
