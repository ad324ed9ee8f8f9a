"""Pipeline parallelism: schedules as data, stages cut from a model, an executor.

==================  ==============================================================
``schedule``        the schedule type and generators (GPipe, 1F1B, interleaved,
                    breadth-first, ZB-H1, ZB-H2, ZB-V, DualPipeV, DualPipe), the
                    checker and the replay; defined, torch-free, in
                    :mod:`distlab.core.pipeline_schedule` and
                    :mod:`distlab.sim.pipeline_replay`, re-exported here
``partition``       the tiny GPT as a list of layers; balanced cuts by parameter
                    count or measured time
``stage``           :class:`PipelineStage`: one rank's model chunks (loop or V)
``executor``        :func:`run_pipeline`: one rank walks its actions, sending
                    activations and gradients point-to-point
``torch_exchange``  :func:`to_torch`/:func:`from_torch`: schedules to and from
                    ``torch.distributed.pipelining`` action lists and CSV
==================  ==============================================================

The schedule lives in :mod:`distlab.core` because the bubble calculator,
the simulator and the plots read it without importing torch; this package
is where it runs. Inside ``distlab.run(fn, world_size=p)``::

    schedule = one_f_one_b(p, 4)
    stage = gpt_stage(GPT(config), rank, p)
    run = run_pipeline(schedule, stage, tokens, targets)   # gradients in .grad
"""

from __future__ import annotations

from distlab.core.pipeline_schedule import (
    Action,
    PipelineSchedule,
    breadth_first,
    build,
    dualpipe,
    dualpipe_v,
    gpipe,
    interleaved,
    one_f_one_b,
    stage_to_rank,
    with_communication,
    zb_h1,
    zb_h2,
    zb_v,
)
from distlab.core.renamed import old_names
from distlab.sim.pipeline_replay import ScheduleError, Timeline, check, replay

from .executor import PipelineError, RankRun, measured_timeline, run_pipeline
from .partition import balanced_split, gpt_layers, measured_costs, parameter_costs
from .stage import PipelineStage, gpt_stage, next_token_loss
from .torch_exchange import from_torch, read_csv, to_torch, torch_schedule, write_csv

__all__ = [
    "Action",
    "PipelineError",
    "PipelineSchedule",
    "PipelineStage",
    "RankRun",
    "ScheduleError",
    "Timeline",
    "balanced_split",
    "breadth_first",
    "build",
    "check",
    "dualpipe",
    "dualpipe_v",
    "from_torch",
    "gpipe",
    "gpt_layers",
    "gpt_stage",
    "interleaved",
    "measured_costs",
    "measured_timeline",
    "next_token_loss",
    "one_f_one_b",
    "parameter_costs",
    "read_csv",
    "replay",
    "run_pipeline",
    "stage_to_rank",
    "to_torch",
    "torch_schedule",
    "with_communication",
    "write_csv",
    "zb_h1",
    "zb_h2",
    "zb_v",
]


# the old name, which notebooks from older releases still import from here
__getattr__ = old_names(__name__, {"Schedule": PipelineSchedule})
