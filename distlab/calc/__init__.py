"""Calculators: the course's numbers, each from a formula that names its source.

Pure Python and numpy (through :mod:`distlab.core.layout`), no torch. Bytes, seconds and
FLOPs throughout; :mod:`~distlab.core.units` formats GB (1e9) and GiB (2^30).

* :mod:`~distlab.calc.memory`: model-state bytes per GPU for ZeRO stages 0-3
  (Rajbhandari et al. 2020, Section 5), activation bytes per layer (Korthikanti et al.
  2022, Section 4, Table 2), a planner-level peak estimate;
* :mod:`~distlab.calc.pipeline`: bubble fractions and in-flight micro-batches
  (Narayanan et al. 2021, Section 2.2), and the GPipe/1F1B/interleaved schedules as data;
* :mod:`~distlab.calc.flops`: 6N, the Megatron-LM step formula, MFU, step time;
* :mod:`~distlab.calc.comm`: bytes per GPU for DDP, ZeRO, FSDP, TP, PP and CP,
  from the parts of :mod:`~distlab.calc.volume` (bytes and messages of one
  collective, time on a link);
* :mod:`~distlab.calc.moe`: expert capacity and expert parallelism's all-to-alls;
* :mod:`~distlab.calc.buckets`: the gradient buckets DDP and ZeRO cut;
* :mod:`~distlab.calc.scaling`: Amdahl, Gustafson, linear LR scaling, batch;
* :mod:`~distlab.calc.storage`: tokenized data read per second, checkpoint
  bytes and write time;
* :mod:`~distlab.calc.transformer`: model shapes and presets (1B ... 175B);
* :mod:`~distlab.calc.planner`: enumerate and rank 3D-parallel layouts
  (``distlab plan``; loaded on first use: it imports the cluster topology);
* :mod:`~distlab.calc.three_d`: what each rank of distlab's ``train_3d`` sends,
  and that layout's step time beside the planner's (imported by name).

Example::

    from distlab import calc
    calc.memory.model_state_bytes(7.5e9, zero_stage=3, dp=64).total / 1e9   # 1.875 GB
    calc.pipeline.bubble_fraction(4, 8, schedule="1f1b")                    # 3/11
"""

from __future__ import annotations

import importlib

from . import buckets, comm, flops, memory, moe, pipeline, scaling, storage, transformer, volume

__all__ = [
    "buckets",
    "comm",
    "flops",
    "memory",
    "moe",
    "pipeline",
    "planner",
    "scaling",
    "storage",
    "transformer",
    "volume",
]


def __getattr__(name: str):
    if name == "planner":  # imports distlab.sim.topology; loaded when first used
        return importlib.import_module(f"{__name__}.planner")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
