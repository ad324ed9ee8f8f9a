"""Message sizes as people write them: ``4KiB``, ``1GiB``, ``64MB``, ranges ``4KiB:1GiB``.

Binary units (KiB = 2**10, MiB = 2**20, GiB = 2**30) and decimal units
(KB = 1e3, MB = 1e6, GB = 1e9) are both accepted and kept apart, as in the
rest of distlab. A range ``lo:hi`` doubles from ``lo`` up to ``hi`` like
nccl-tests' ``-b lo -e hi -f 2``.
"""

from __future__ import annotations

import re

UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """``"4KiB"`` -> 4096, ``"1.5MB"`` -> 1500000. Sizes must be whole bytes > 0."""
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    if not match or unit not in UNITS:
        raise ValueError(
            f"bad size {text!r}; write a number with an optional unit from "
            f"B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. 4KiB)"
        )
    value = float(match.group(1)) * UNITS[unit]
    if value != int(value) or value <= 0:
        raise ValueError(f"size {text!r} must be a whole number of bytes > 0, got {value}")
    return int(value)


def size_range(spec: str, factor: int = 2) -> list[int]:
    """``"4KiB:1GiB"`` -> 4 KiB, 8 KiB, ... 1 GiB; ``"4KiB,1MiB"`` -> the list; one size -> [size]."""
    if not isinstance(factor, int) or factor < 2:
        raise ValueError(f"factor must be an integer >= 2, got {factor!r}")
    if ":" in spec:
        lo_text, _, hi_text = spec.partition(":")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if hi < lo:
            raise ValueError(f"size range {spec!r} ends below its start")
        sizes = [lo]
        while sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
        return sizes
    return [parse_size(part) for part in spec.split(",")]


def format_bytes(n_bytes: float) -> str:
    """Binary units: ``4096`` -> ``"4 KiB"``, ``3 * 2**30`` -> ``"3 GiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.4g} {unit}"
    return f"{n_bytes:.4g} B"
