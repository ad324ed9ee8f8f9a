"""Bad input for tensor parallelism: found before the first collective, on every rank.

A shape that does not divide by t is the same on every rank, so every rank
raises the same ``ValueError`` on its own. Ranks that disagree (built from
different dense models, or with different sizes) would hang or silently train
different models; :class:`~distlab.parallel.tensor.model.ParallelGPT` compares
the dense model across the tensor-parallel group first
(:func:`distlab.parallel.comm.agreement.check_same_across_ranks`), which raises on
every rank, naming the first parameter that differs.
"""

from __future__ import annotations


def check_divisible(what: str, value: int, t: int, *, by: str = "tensor-parallel size") -> int:
    """``value // t``, or ``ValueError`` naming ``what`` when ``t`` does not divide it."""
    if value % t:
        raise ValueError(
            f"{what}={value} is not divisible by the {by} {t}: choose a size that is a "
            f"multiple of {t} (or a degree that divides {value})"
        )
    return value // t
