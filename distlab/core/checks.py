"""Argument checks shared by every floor: one clear error per bad value, naming it.

One rule for integers (:func:`int_in`): a value that is not a number is a ``TypeError``, a
number that is not whole or out of range a ``ValueError``; the message names the argument,
the range and the value. Pure Python, so the calculators, the simulator, the launcher and
the training code all use the same checks.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable


def int_in(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``low..high`` (no upper bound when ``high`` is None).

    The one integer rule of distlab: ``TypeError`` for what is not a number (``True`` and
    ``False`` included, and ``"4"``), ``ValueError`` for a number that is not whole (2.5,
    nan, inf) or lies outside the range. A whole float (64.0, as JSON and CLIs give) is
    accepted and returned as an int, so callers use the returned value.
    """
    if type(value) is int and value >= low and (high is None or value <= high):
        return value  # the common case, first: the planner checks millions of degrees
    bounds = f"in {low}..{high}" if high is not None else f">= {low}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be an integer {bounds}, got {value!r}")
    whole = not isinstance(value, float) or value.is_integer()
    if not whole or value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")
    return int(value)


def positive_int(name: str, value: object) -> int:
    """``value`` as an int >= 1 (:func:`int_in`'s rule)."""
    if type(value) is int and value >= 1:
        return value  # the common case, without the call: the planner checks millions
    return int_in(name, value, 1)


def positive(name: str, value: object) -> float:
    """``value`` as a finite float > 0, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number > 0, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def nonnegative(name: str, value: object) -> float:
    """``value`` as a finite float >= 0, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number >= 0, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def nonnegative_int(name: str, value: object) -> int:
    """``value`` as an int >= 0 (a seed, a count that may be zero; :func:`int_in`'s rule)."""
    return int_in(name, value, 0)


def fraction(name: str, value: object, *, allow_one: bool = True) -> float:
    """``value`` in [0, 1] (or [0, 1) when ``allow_one`` is False)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r}")
    upper_ok = value <= 1 if allow_one else value < 1
    if not (value >= 0 and upper_ok):
        bound = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name} must be in {bound}, got {value!r}")
    return float(value)


def choice(name: str, value: object, allowed: Iterable[object]) -> object:
    """``value`` if it is one of ``allowed``, else ValueError listing them."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(map(repr, allowed))}")
    return value


def divides(name: str, divisor: int, total_name: str, total: int) -> None:
    """ValueError unless ``divisor`` divides ``total``."""
    if total % divisor:
        raise ValueError(
            f"{total_name}={total} is not divisible by {name}={divisor}; "
            f"choose {name} among the divisors of {total}: {divisors(total)}"
        )


def divisors(n: int) -> list[int]:
    """All divisors of ``n`` in increasing order."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def cli(
    check: Callable[[str, object], object], *, integer: bool = False
) -> Callable[[str], object]:
    """An argparse ``type=`` that reads a number and refuses it with ``check``'s own message.

    ``p.add_argument("--stages", type=cli(positive_int, integer=True))`` makes argparse print
    ``argument --stages: value must be an integer >= 1, got -1`` (exit status 2), so a bad
    value is refused with the option's name before any code uses it. Text that is not a
    number (or, with ``integer``, not an integer: ``1e30``, ``2.5``) is handed to ``check``
    as it is, which refuses it by type with the same words.
    """

    def convert(text: str) -> object:
        try:
            value: object = int(text) if integer else float(text)
        except ValueError:
            value = text
        try:
            return check("value", value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = check.__name__
    return convert


def below_one(name: str, value: object) -> float:
    """``value`` in [0, 1): :func:`fraction` without 1."""
    return fraction(name, value, allow_one=False)


def above_zero_fraction(name: str, value: object) -> float:
    """``value`` in (0, 1]: a share that must not be zero (an efficiency)."""
    if fraction(name, value) == 0:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)
