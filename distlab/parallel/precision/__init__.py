"""Bytes per number: measure what a rank holds, then hold less (notebooks 01 and 05).

====================  ==============================================================
``memory``            the bytes of parameters, gradients and optimizer state a rank really
                      holds, each storage counted once (compare ``distlab.calc.memory``)
``mixed_precision``   16-bit compute on fp32 master weights: :func:`autocast`,
                      :class:`MixedPrecisionOptimizer`, :class:`DynamicLossScaler` for
                      fp16, and :class:`MixedPrecisionPolicy`, the dtypes FSDP gathers in
====================  ==============================================================

Read ``memory`` first: it is how notebook 05 shows what mixed precision saves, and how
the ``zero`` family shows what sharding saves.
"""

from __future__ import annotations

from .memory import MeasuredModelState, measure_model_state, optimizer_state_tensors, storage_bytes
from .mixed_precision import (
    LOW_PRECISION,
    DynamicLossScaler,
    MixedPrecisionOptimizer,
    MixedPrecisionPolicy,
    autocast,
)

__all__ = [
    "LOW_PRECISION",
    "DynamicLossScaler",
    "MeasuredModelState",
    "MixedPrecisionOptimizer",
    "MixedPrecisionPolicy",
    "autocast",
    "measure_model_state",
    "optimizer_state_tensors",
    "storage_bytes",
]
