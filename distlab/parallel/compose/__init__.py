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

Read in this order:

==============  ====================================================================
``mesh``        :func:`build_mesh`: every process group of the layout (tp, cp, ep, dp,
                pp) by name, from :mod:`distlab.core.ranks`
``blocks``      the pieces put into a tensor-parallel GPT (context-parallel attention,
                a stage's embedding and head, recomputed blocks)
``model``       :func:`parallelize`: the parallelisms applied in one fixed order
``loop``        :func:`train`: one step for every layout
``checkpoint``  save a composed run, resume it bit for bit, load it into another layout
``traffic``     a traced step's traffic per group and collective, against the calculator
``three_d``     :func:`train_3d`: TP x PP x DP, one setting of :func:`train`
==============  ====================================================================

**Why two training loops.** :func:`train` here and
:func:`distlab.parallel.data.training.train_step` use the same parts
(:class:`~distlab.parallel.zero.ZeroOptimizer`, :class:`~distlab.parallel.zero.FSDP`,
the loss scaler of :mod:`distlab.parallel.precision`), but they cannot be one. Tensor,
context, pipeline and expert parallelism rewrite the model (split its heads, cut it
into stages, route its tokens), so :func:`train` must know the model is the GPT and
its batch is tokens; its forward and backward are the pipeline executor's. DDP, ZeRO
and FSDP only touch parameters and gradients, so ``train_step`` takes any
``nn.Module`` and any loss, which is what notebooks 04-06 need (an MLP, a regression,
a step written by hand). ``train`` with ``Layout(dp=n, zero_stage=k)`` on the GPT and
``train_step`` with ``"zero{k}"`` on the same GPT take the same steps
(``tests/test_two_loops.py`` checks that they agree, to fp32 rounding).
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
from .mesh import ParallelMesh, build_mesh
from .model import ORDER, ParallelModel, check_model, cut_stage, dense_shard, parallelize
from .three_d import train_3d

__all__ = [
    "OPTIMIZERS",
    "ORDER",
    "ComposedRun",
    "ContextParallelAttention",
    "ParallelMesh",
    "ParallelModel",
    "PlainSGD",
    "StageEmbedding",
    "StageHead",
    "build_mesh",
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
    "train_3d",
]
