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

from .checks import int_in

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
_UNIT_BY_UPPER = {name.upper(): name for name in BYTE_UNITS}


def parse_bytes(text: str | float) -> float:
    """'80GB' -> 8e10, '80GiB' -> 85899345920, '1.5e9' -> 1.5e9 (plain numbers are bytes).

    Unit names are read case-insensitively ('4kib' == '4KiB'); KB is 10^3, KiB 2^10.
    """
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _SIZE_RE.match(str(text))
        unit = _UNIT_BY_UPPER.get(match.group(2).upper() or "B") if match else None
        if unit is None:
            raise ValueError(
                f"cannot read a byte size from {text!r}; use a number and one of {list(BYTE_UNITS)}"
            )
        value = float(match.group(1)) * BYTE_UNITS[unit]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"size {text!r} must be a positive, finite number of bytes")
    return value


def parse_size(text: str | int) -> int:
    """A message size in whole bytes: '4KiB' -> 4096, '1.5 KB' -> 1500, '12' -> 12.

    Like :func:`parse_bytes`, and the result must be a whole number of bytes.
    """
    value = parse_bytes(text)
    if value != int(value):
        raise ValueError(f"size {text!r} must be a whole number of bytes, got {value}")
    return int(value)


def size_range(spec: str, factor: int = 2) -> list[int]:
    """Message sizes from a command line; the one rule every ``distlab`` command uses.

    * ``"lo:hi"``: ``lo, lo*factor, lo*factor^2, ...`` below ``hi``, then ``hi``
      (nccl-tests' ``-b lo -e hi -f factor``, always ending at ``hi``);
    * ``"lo:hi:f"``: the same with factor ``f`` (``"4KiB:64MiB:16"``);
    * ``"4KiB,1MiB"``: those sizes; one size: ``[size]``.

    ``size_range("4KiB:64KiB") == [4096, 8192, 16384, 32768, 65536]``.
    """
    parts = str(spec).split(":")
    if len(parts) == 1:
        return [parse_size(part) for part in parts[0].split(",")]
    if len(parts) == 3:
        factor = _range_factor(parts[2], spec)
    elif len(parts) != 2:
        raise ValueError(f"size range {spec!r} must be lo:hi or lo:hi:factor")
    factor = int_in("size range factor", factor, 2)
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    if hi < lo:
        raise ValueError(f"size range {spec!r} ends below its start")
    sizes = [lo]
    while sizes[-1] * factor < hi:
        sizes.append(sizes[-1] * factor)
    return sizes if sizes[-1] == hi else [*sizes, hi]


def _range_factor(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"size range {spec!r}: factor {text!r} is not an integer >= 2") from None


def format_size(n_bytes: float) -> str:
    """A size in the largest binary unit it reaches: ``4096`` -> ``"4 KiB"``, ``3 * 2**30`` ->
    ``"3 GiB"``, ``1000`` -> ``"1000 B"`` (4 significant digits). Tables of message sizes use it;
    :func:`format_bytes` prints in a unit you choose."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n_bytes >= BYTE_UNITS[unit]:
            return f"{n_bytes / BYTE_UNITS[unit]:.4g} {unit}"
    return f"{n_bytes:.4g} B"


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ('bf16' -> 2)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]
