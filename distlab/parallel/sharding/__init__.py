"""Sharded-matmul algebra: a notation for sharded arrays, the cases of a sharded matmul,
what each costs, and the plans run on real processes.

============  ================================================================
``notation``  ``A[I, J_x]``: which dimension of an array a mesh axis splits
``plans``     the four cases; every plan (collectives before and after the
              multiply) with its bytes per rank from :mod:`distlab.calc.volume`
``execute``   a plan on ``distlab.run`` ranks: result against the dense
              product, bytes counted on the wire against the formula
============  ================================================================
"""

from __future__ import annotations

from .execute import PlanMeasurement, block_of, measure_plans, run_plan
from .notation import Dim, Sharded, sharded
from .plans import CASES, Plan, Step, best_plan, matmul_case, plan_with, plans

__all__ = [
    "CASES",
    "Dim",
    "Plan",
    "PlanMeasurement",
    "Sharded",
    "Step",
    "best_plan",
    "block_of",
    "matmul_case",
    "measure_plans",
    "plan_with",
    "plans",
    "run_plan",
    "sharded",
]
