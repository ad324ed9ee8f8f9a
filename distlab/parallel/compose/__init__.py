"""Compose any parallelism from one layout: ``parallelize(model, layout)`` and one ``train`` loop.

::

    from distlab import Layout
    from distlab.parallel.compose import parallelize, train

    layout = Layout(tp=2, cp=2, dp=2)                   # on 8 ranks
    run = train(GPT(config, seed=0), layout, tokens, targets, steps=10, lr=0.1)

A layout is a setting, not a file: TP x CP x DP, TP x PP x CP, TP x EP x PP,
TP x PP x DP with FSDP, sequence parallelism with the interleaved schedule all
run through the same two functions (:mod:`.model` for the order in which the
parallelisms are applied, :mod:`.loop` for the step); :mod:`.checkpoint` saves a
run of any layout and loads it into any other. ``train`` first checks that every
rank got the same model, layout, batch and settings, and otherwise raises the same
``ValueError`` on every rank, naming what differs.
"""

from .blocks import ContextParallelAttention, StageEmbedding, StageHead
from .checkpoint import load_checkpoint, save_checkpoint
from .loop import (
    OPTIMIZERS,
    ComposedRun,
    PlainSGD,
    final_parameters,
    make_optimizer,
    my_batch,
    train,
)
from .model import ORDER, ParallelModel, check_model, cut_stage, dense_shard, parallelize

__all__ = [
    "OPTIMIZERS",
    "ORDER",
    "ComposedRun",
    "ContextParallelAttention",
    "ParallelModel",
    "PlainSGD",
    "StageEmbedding",
    "StageHead",
    "check_model",
    "cut_stage",
    "dense_shard",
    "final_parameters",
    "load_checkpoint",
    "make_optimizer",
    "my_batch",
    "parallelize",
    "save_checkpoint",
    "train",
]
