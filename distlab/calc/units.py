"""Units: distlab counts bytes, seconds and FLOPs; these helpers name the scale.

Two gigabytes are in common use and differ by 7%:

* **GB = 10^9 bytes** (SI). Papers (ZeRO, Megatron-LM) and GPU data sheets
  ("80 GB") use it; distlab's tables use it unless they say GiB.
* **GiB = 2^30 bytes** (IEC). ``nvidia-smi`` reports MiB, and memory
  allocators work in powers of two.

Every formatter states its unit, so a number is never ambiguous.
"""

from __future__ import annotations

import math
import re

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

#: unit name -> bytes; accepted by :func:`parse_bytes` and :func:`format_bytes`
BYTE_UNITS: dict[str, float] = {
    "B": 1,
    "KB": KB,
    "MB": MB,
    "GB": GB,
    "TB": TB,
    "KiB": KiB,
    "MiB": MiB,
    "GiB": GiB,
    "TiB": TiB,
}

#: bytes per element of the dtypes the calculators know
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "tf32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
}


def to_gb(n_bytes: float) -> float:
    """Bytes -> GB (10^9 bytes)."""
    return n_bytes / GB


def to_gib(n_bytes: float) -> float:
    """Bytes -> GiB (2^30 bytes)."""
    return n_bytes / GiB


def format_bytes(n_bytes: float, unit: str = "GB", digits: int = 2) -> str:
    """``format_bytes(31.40625e9) == '31.41 GB'``; ``unit`` is one of :data:`BYTE_UNITS`."""
    if unit not in BYTE_UNITS:
        raise ValueError(f"unknown byte unit {unit!r}; allowed: {list(BYTE_UNITS)}")
    return f"{n_bytes / BYTE_UNITS[unit]:.{digits}f} {unit}"


def format_seconds(seconds: float) -> str:
    """A duration with a readable unit: '3.20 s', '45.0 ms', '12.5 us'."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_count(n: float) -> str:
    """A count with an SI suffix: 6.74e9 -> '6.74B', 3.1e23 -> '3.1e+23'."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale and abs(n) < 1000 * scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | float) -> float:
    """'80GB' -> 8e10, '80GiB' -> 85899345920, '1.5e9' -> 1.5e9 (plain numbers are bytes)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _SIZE_RE.match(str(text))
        unit = match.group(2) if match else None
        if match is None or (unit and unit not in BYTE_UNITS):
            raise ValueError(
                f"cannot read a byte size from {text!r}; use a number and one of {list(BYTE_UNITS)}"
            )
        value = float(match.group(1)) * BYTE_UNITS[unit or "B"]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a byte size must be a positive number, got {text!r}")
    return value


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ('bf16' -> 2)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]
