"""Numeric checks: every number a card states is recomputed with distlab.

A check's ``expr`` is a Python expression over ``calc`` (:mod:`distlab.calc`), ``sim``
(:mod:`distlab.sim`) and ``math``; it passes when the result is within ``rel_tol`` of the
``value`` the card states (``math.isclose``). ``calc.memory`` and ``sim.topology`` resolve
even if the package ``__init__`` does not import those submodules.
"""

from __future__ import annotations

import builtins
import importlib
import math
from dataclasses import dataclass

from flashcards.model import Card, Check, Deck

_BUILTINS = {
    name: getattr(builtins, name)
    for name in ("abs", "min", "max", "round", "sum", "len", "float", "int", "pow", "range")
}


class _Package:
    """A package whose submodules import on first attribute access (``calc.memory``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._name)
        if hasattr(module, attr):
            return getattr(module, attr)
        try:
            return importlib.import_module(f"{self._name}.{attr}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{self._name}.{attr}":
                raise
            raise AttributeError(f"{self._name} has no attribute or submodule {attr!r}") from None

    def __repr__(self) -> str:
        return f"<package {self._name}>"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check of one card."""

    card: Card
    check: Check
    actual: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and agrees(self.actual, self.check)

    def message(self) -> str:
        head = f"{self.card.source} card {self.card.slug!r}: {self.check.expr}"
        if self.error is not None:
            return f"{head} failed: {self.error}"
        verdict = "ok" if self.ok else f"MISMATCH (rel_tol {self.check.rel_tol:g})"
        return f"{head} = {self.actual!r}; card states {self.check.value!r} ({self.check.text!r}) {verdict}"


def namespace() -> dict[str, object]:
    """The names a check expression may use."""
    return {
        "__builtins__": _BUILTINS,
        "calc": _Package("distlab.calc"),
        "sim": _Package("distlab.sim"),
        "math": math,
    }


def evaluate(check: Check, names: dict[str, object] | None = None) -> float:
    """Evaluate ``check.expr``; raises TypeError unless the result is a real number."""
    result = eval(check.expr, dict(names or namespace()))
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise TypeError(
            f"expression {check.expr!r} gave {result!r} ({type(result).__name__}); expected a number"
        )
    return float(result)


def run_check(card: Card, check: Check, names: dict[str, object] | None = None) -> CheckResult:
    """Evaluate one check, turning any exception into a failed :class:`CheckResult`."""
    try:
        actual = evaluate(check, names)
    except Exception as exc:  # noqa: BLE001 - reported per card, never swallowed
        return CheckResult(card, check, None, f"{type(exc).__name__}: {exc}")
    return CheckResult(card, check, actual)


def run_checks(deck: Deck | list[Card]) -> list[CheckResult]:
    """Run every check of every card."""
    names = namespace()
    return [run_check(card, check, names) for card in deck for check in card.checks]


def agrees(actual: float | None, check: Check) -> bool:
    """Whether ``actual`` is within ``check.rel_tol`` of the value ``check`` states."""
    if actual is None:
        return False
    return math.isclose(actual, check.value, rel_tol=check.rel_tol, abs_tol=1e-12)
