"""Notebooks 08-10 as a learner receives them (issue 27).

Run All on a released notebook must stop only in exercises and their tests: a cell
outside them that uses an exercise function (a worked problem, a "run your
schedule" demo) catches the stub's ``NotImplementedError``, as notebook 09's
placement drawing does. This reads the cells' code (no kernel), so it is quick;
``tests/test_course.py`` executes the released notebooks for the same rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = [
    "08-pipeline-parallelism",
    "09-3d-parallelism-and-placement",
    "10-checkpointing-and-elasticity",
]


def _nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def exercise_functions(nb) -> set[str]:
    """Names the solution cells define (the functions a learner writes)."""
    names = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and _nbgrader(cell).get("solution"):
            tree = ast.parse(cell.source)
            names |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return names


def _catches_not_implemented(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id == "NotImplementedError" for k in kinds)


def unguarded_uses(source: str, functions: set[str]) -> list[str]:
    """Exercise functions a cell's top-level code uses outside ``try: ... except
    NotImplementedError`` (uses inside a ``def`` run only when it is called)."""
    found = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.Try):
            safe = guarded or any(_catches_not_implemented(h) for h in node.handlers)
            for child in node.body:
                visit(child, safe)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, guarded)
            return
        if isinstance(node, ast.Name) and node.id in functions and not guarded:
            found.append(f"line {node.lineno}: {node.id}")
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(source), False)
    return found


def test_the_check_sees_an_unguarded_call_and_accepts_a_guarded_one():
    functions = {"young_interval"}
    assert unguarded_uses("tau = young_interval(60, 3600)\nprint(tau)", functions) == [
        "line 1: young_interval"
    ]
    assert unguarded_uses("check(young_interval, 1)", functions) == ["line 1: young_interval"]
    guarded = "try:\n    tau = young_interval(60, 3600)\nexcept NotImplementedError:\n    pass"
    assert unguarded_uses(guarded, functions) == []
    other = "try:\n    tau = young_interval(60, 3600)\nexcept ValueError:\n    pass"
    assert unguarded_uses(other, functions) == ["line 2: young_interval"]
    assert unguarded_uses("def f():\n    return young_interval(1, 2)", functions) == []


@pytest.mark.parametrize("name", NAMES)
def test_released_notebook_calls_exercises_only_in_exercises_tests_or_guards(name):
    released = ROOT / "course" / name / f"{name}.ipynb"
    nb = nbformat.read(released, as_version=4)
    functions = exercise_functions(nb)
    assert functions, f"{name}: no exercise functions found in the solution cells"
    stray = {}
    for cell in nb.cells:
        if (
            cell.cell_type != "code"
            or _nbgrader(cell).get("solution")
            or _nbgrader(cell).get("grade")
        ):
            continue
        uses = unguarded_uses(cell.source, functions)
        if uses:
            stray[cell.get("id")] = uses
    assert not stray, (
        f"{name}: cells outside the exercises use unfinished exercise functions without "
        f"catching NotImplementedError (Run All would stop there): {stray}"
    )
