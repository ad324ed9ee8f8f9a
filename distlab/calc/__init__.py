"""Calculators: the course's numbers, each from a formula that names its source.

Pure Python, no torch: ``import distlab.calc`` is instant. Bytes, seconds and
FLOPs throughout; :mod:`~distlab.core.units` formats GB (1e9) and GiB (2^30).

* :mod:`~distlab.calc.memory`: model-state bytes per GPU for ZeRO stages 0-3
  (Rajbhandari et al. 2020), activation bytes per layer (Korthikanti et al.
  2022), a planner-level peak estimate;
* :mod:`~distlab.calc.pipeline`: bubble fractions and in-flight micro-batches
  (Narayanan et al. 2021), and the GPipe/1F1B/interleaved schedules as data;
* :mod:`~distlab.calc.flops`: 6N, the Megatron-LM step formula, MFU, step time;
* :mod:`~distlab.calc.comm`: bytes per GPU for DDP, ZeRO, FSDP, TP and PP;
* :mod:`~distlab.calc.scaling`: Amdahl, Gustafson, linear LR scaling, batch;
* :mod:`~distlab.calc.storage`: tokenized data read per second, checkpoint
  bytes and write time;
* :mod:`~distlab.calc.transformer`: model shapes and presets (1B ... 175B);
* :mod:`~distlab.calc.planner`: enumerate and rank 3D-parallel layouts
  (``distlab plan``; loaded on first use).

Example::

    from distlab import calc
    calc.memory.model_state_bytes(7.5e9, zero_stage=3, dp=64).total / 1e9   # 1.875 GB
    calc.pipeline.bubble_fraction(4, 8, schedule="1f1b")                    # 3/11
"""

from __future__ import annotations

import importlib

from . import comm, flops, memory, pipeline, scaling, storage, transformer

__all__ = [
    "comm",
    "flops",
    "memory",
    "pipeline",
    "planner",
    "scaling",
    "storage",
    "transformer",
]


def __getattr__(name: str):
    if name == "planner":  # imports distlab.sim.topology; loaded when first used
        return importlib.import_module(f"{__name__}.planner")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
