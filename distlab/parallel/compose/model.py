"""``parallelize(model, layout)``: every parallelism of a :class:`~distlab.core.layout.Layout`
applied to a plain GPT, in one fixed order.

Call it on every rank (inside ``distlab.run`` or under ``torchrun``) with the same
plain model, :class:`distlab.models.GPT` or :class:`distlab.parallel.moe.gpt.MoEGPT`.
Each rank keeps its share, in this order (the order of Megatron-core and of
torchtitan's ``parallelize``: each step works on what the previous one left):

1. **tensor** (Megatron-LM, Shoeybi et al. 2019): q, k, v and fc1 column-parallel,
   the output projection and fc2 row-parallel, embedding and output layer
   vocabulary-parallel over the ``"tp"`` group; with ``sequence_parallel`` the
   LayerNorms, dropout and residual stream hold s/t tokens (Korthikanti et al. 2022, Section 4.2.2);
2. **context**: each sequence is split over the ``"cp"`` group (``split``:
   "zigzag" balances causal work, "contiguous" is the plain cut); every block's
   attention core becomes ring attention over the cp ranks, on this rank's
   tensor-parallel heads (:class:`~distlab.parallel.compose.blocks.ContextParallelAttention`),
   and the position embedding uses the tokens' global positions;
3. **expert**: the MLP of every MoE block becomes an
   :class:`~distlab.parallel.moe.layer.ExpertParallelMoE` over the ``"ep"`` group
   (E/ep whole experts per rank, tokens exchanged by all-to-all);
4. **pipeline** (:func:`cut_stage`): the L blocks are cut into one part per
   virtual stage (DualPipe: per stage of one of its two copies); this rank keeps
   the chunks the schedule places on its ``"pp"`` coordinate (loop or V), the
   embedding with the first part and the head with the last;
5. **data**: over the ``"dp-cp"`` group (data and context ranks both hold whole
   copies of the stage and see different tokens), one of: plain averaging of
   the gradients (``zero_stage=0``), ZeRO-1 or -2 (:class:`~distlab.parallel.zero.optimizer.ZeroOptimizer`,
   built by the training loop), or FSDP (``zero_stage=3``: each chunk wrapped in
   :class:`~distlab.parallel.zero.fsdp.FSDP`, its parameters sharded over dp-cp).

Combinations distlab refuses, each with a ``ValueError`` that says why:
sequence parallelism with MoE blocks (the TP ranks of a replica must see the same
tokens to route them alike) or with FSDP (a sequence-parallel gradient is a
partial sum over tp that FSDP would scatter before it is summed); ZeRO or FSDP
with ``ep > 1`` (expert gradients are reduced over the expert-data-parallel group,
not dp-cp); ZeRO-2 or FSDP with tied embeddings across pipeline stages (the tied
gradient is exchanged after backward, when they have already scattered it), and
likewise ZeRO-2 or FSDP with DualPipe (the two copies of a model part add their
gradients after backward).

Recomputation (``layout.recompute``): ``"selective"`` recomputes each block's
attention core in backward (Korthikanti et al. 2022, Section 5; with cp > 1 the
core's K/V messages are sent again), ``"full"`` wraps each block in a
:class:`~distlab.parallel.compose.blocks.RecomputedBlock` (only its input kept).

Pipeline schedules: any of :data:`distlab.core.pipeline_schedule.GENERATORS`; the
V-shaped ZB-V and DualPipeV and the two-way DualPipe are cut by the same
:func:`cut_stage` from the schedule's own placement.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from distlab.core.layout import Layout
from distlab.core.pipeline_schedule import BIDIRECTIONAL, chunks_of
from distlab.core.sequence_split import chunk_count
from distlab.models import GPT, GPTBlock
from distlab.parallel.compose.mesh import ParallelMesh, build_mesh
from distlab.parallel.context.gather import KVGather
from distlab.parallel.context.ring import ContextGroup, Ring
from distlab.parallel.context.ulysses import Ulysses
from distlab.parallel.moe.gpt import ParallelMoEBlock
from distlab.parallel.moe.layer import MoE
from distlab.parallel.pipeline import PipelineSchedule, PipelineStage, build
from distlab.parallel.pipeline.stage import tied_embedding_peer
from distlab.parallel.precision.mixed_precision import MixedPrecisionPolicy
from distlab.parallel.tensor import (
    ParallelBlock,
    ParallelGPT,
    TensorParallelComm,
    vocab_parallel_cross_entropy,
)
from distlab.parallel.tensor.checks import check_divisible
from distlab.parallel.tensor.layers import block_shard
from distlab.parallel.tensor.rng import RNGTracker
from distlab.parallel.tensor.vocab import vocab_shard
from distlab.parallel.zero.fsdp import FSDP

from .blocks import ContextParallelAttention, RecomputedBlock, StageEmbedding, StageHead

#: the order parallelize applies the parallelisms in
ORDER = ("tensor", "context", "expert", "pipeline", "data")
SPLITS = ("zigzag", "contiguous")
#: the blocks ``recompute="full"`` wraps in a :class:`RecomputedBlock`
BLOCKS = (ParallelBlock, ParallelMoEBlock)
#: how the context-parallel ranks compute attention over the whole sequence
CONTEXT_ATTENTION = {"ring": Ring, "all_gather": KVGather, "ulysses": Ulysses}
#: ``precision``: the dtype the matmuls run in (``None``: fp32 throughout); see :func:`parallelize`
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit dtype ``precision`` computes in, ``None`` for "fp32"; ``ValueError`` naming
    a precision that is not one of :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


@dataclass
class ParallelModel:
    """This rank's share of the model under ``layout``.

    ``gpt``: the tensor/context/expert-parallel GPT (every block built; the stage
    uses its own); ``stage``: the chunks this rank runs, FSDP-wrapped when
    ``layout.fsdp``; ``schedule``: the pipeline schedule; ``fsdp``: the FSDP
    wrappers (empty otherwise); ``context_groups``: one context-parallel group per
    block (their counters hold the K/V bytes sent, the work and the K/V held)."""

    layout: Layout
    mesh: ParallelMesh
    gpt: ParallelGPT
    stage: PipelineStage
    schedule: PipelineSchedule
    fsdp: list[FSDP]
    context_groups: list[ContextGroup]

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps: the stage's parameters (FSDP: its shards)."""
        if self.fsdp:
            return [p for wrapper in self.fsdp for p in wrapper.parameters()]
        return self.stage.parameters()

    def finish_gradients(self) -> None:
        """After the pipeline's backward passes: sum the sequence-parallel gradients over tp."""
        self.gpt.finish_gradients()


def check_model(
    model: GPT, layout: Layout, *, split: str = "zigzag", context: str = "ring"
) -> PipelineSchedule:
    """The pipeline schedule ``layout`` names, or ``ValueError`` naming the value unless
    ``model`` can run under ``layout``: tp | heads and hidden, pp * v | layers, the
    sequence splits into the cp chunks (and their SP slices), ep | experts, the
    schedule can run the micro-batches, and none of the refused combinations (module
    docstring); ``TypeError`` for a ``layout`` that is not a :class:`Layout` or a
    ``model`` that is not a distlab GPT. Needs no process group.

    The one check of a layout against a model: :func:`parallelize` makes it before it
    builds anything, and :func:`~distlab.parallel.compose.train` once, with its batch
    (:func:`~distlab.parallel.compose.loop.check_train`)."""
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a distlab Layout, got {type(layout).__name__}")
    if not isinstance(model, GPT):
        raise TypeError(f"parallelize takes a distlab GPT or MoEGPT, got {type(model).__name__}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if context not in CONTEXT_ATTENTION:
        raise ValueError(f"context must be one of {tuple(CONTEXT_ATTENTION)}, got {context!r}")
    c, moe = model.config, getattr(model, "moe_config", None)
    check_divisible("heads", c.heads, layout.tp)
    check_divisible("hidden", c.hidden, layout.tp)
    name, chunks = (
        layout.pipeline_schedule,
        chunks_of(layout.pipeline_schedule, layout.virtual_stages),
    )
    parts = layout.pp * chunks // (2 if name in BIDIRECTIONAL else 1)
    check_divisible("layers", c.layers, parts, by=_parts_text(name, layout.pp, chunks))
    pieces = chunk_count(layout.cp, split) * (layout.tp if layout.sequence_parallel else 1)
    check_divisible(
        "seq_len",
        c.seq_len,
        pieces,
        by=f"number of sequence pieces ({split} over cp, x tp with SP) =",
    )
    if moe is not None:
        check_divisible("num_experts", moe.num_experts, layout.ep, by="expert-parallel size ep")
    elif layout.ep > 1:
        raise ValueError(f"ep={layout.ep} needs a model with MoE blocks (MoEGPT), got a dense GPT")
    if layout.sequence_parallel and moe is not None:
        raise ValueError("sequence_parallel with MoE blocks is not supported: the TP ranks "
                         "of a replica must route the same tokens")  # fmt: skip
    if layout.fsdp and layout.sequence_parallel:
        raise ValueError("FSDP (zero_stage=3) with sequence_parallel is not supported: "
                         "sequence-parallel gradients are partial sums over tp")  # fmt: skip
    if layout.zero_stage and layout.ep > 1:
        raise ValueError(f"zero_stage={layout.zero_stage} with ep={layout.ep} is not supported: "
                         "expert gradients reduce over expert_dp, not dp-cp")  # fmt: skip
    if layout.zero_stage >= 2 and layout.pp > 1 and c.tie_embeddings:
        raise ValueError(f"zero_stage={layout.zero_stage} with pp > 1 needs tie_embeddings=False: "
                         "the tied gradient is exchanged between stages after ZeRO-2/FSDP "
                         "has reduce-scattered it")  # fmt: skip
    if layout.pipeline_schedule == "dualpipe" and layout.zero_stage >= 2:
        raise ValueError(f"zero_stage={layout.zero_stage} with schedule 'dualpipe' is not "
                         "supported: the two copies of a model part add their gradients after "
                         "the backward passes, when ZeRO-2/FSDP has already reduce-scattered "
                         "them")  # fmt: skip
    if layout.cp > 1 and c.dropout:
        raise ValueError(f"context parallelism needs dropout 0, got {c.dropout}")
    return build(name, layout.pp, layout.micro_batches, chunks=layout.virtual_stages)


def model_parts(schedule: PipelineSchedule) -> int:
    """How many parts the model is cut into: one per virtual stage, p v (a V: 2 p), or for
    DualPipe's two copies p v / 2 = p."""
    n = schedule.stages * schedule.chunks
    return n // 2 if schedule.bidirectional else n


def _parts_text(name: str, p: int, v: int) -> str:
    if name in BIDIRECTIONAL:
        return f"number of model parts of {name!r} (pp = {p}: one per stage, two copies) ="
    return f"number of virtual stages pp*v = {p}*{v} ="


def _block_maker(layout, mesh, groups: list, split: str, context, algorithm, rng):
    """Steps 2 and 3: the function :class:`ParallelGPT` builds each block with."""

    def make_block(dense: GPTBlock, comm: TensorParallelComm, *, sequence_parallel: bool):
        if isinstance(dense.mlp, MoE):  # expert parallelism
            all_to_all = "builtin" if algorithm == "builtin" else "pairwise"
            block = ParallelMoEBlock(dense, comm, mesh["ep"], all_to_all)
            block.attn.rng = rng  # its attention is tensor-parallel like any other
        else:
            block = ParallelBlock(dense, comm, sequence_parallel=sequence_parallel, rng=rng)
        if layout.cp > 1:  # context parallelism: the attention core over the cp ranks
            cp = CONTEXT_ATTENTION[context](group=mesh["cp"], split=split)
            groups.append(cp)
            block.attn = ContextParallelAttention(
                dense.attn, comm, cp, sequence_parallel=sequence_parallel
            )
        if layout.recompute == "selective":  # Korthikanti et al. 2022, Section 5
            block.attn.recompute_attention = True
        return block

    return make_block


def cut_stage(gpt: ParallelGPT, stage: int, schedule: PipelineSchedule) -> PipelineStage:
    """Step 4: pipeline rank ``stage``'s chunks of ``gpt`` for ``schedule``.

    The L blocks are cut in order into :func:`model_parts` parts of equal size; chunk c
    of the rank runs virtual stage j = ``schedule.virtual_stage(stage, c)`` and holds
    part ``schedule.model_part(j)``: j itself, where the loop placement gives rank r
    stages r, p + r, ... (Narayanan et al. 2021, Section 2.2.2) and the V of ZB-V and
    DualPipeV stages r and 2p - 1 - r (Qi et al. 2024, Section 6); DualPipe (DeepSeek-AI
    2024, Section 3.2.1) holds two copies of the model cut in p parts, rank r parts r
    (going down) and p - 1 - r (going up), and adds its ``mirror``'s gradients (rank
    p - 1 - r holds the same two parts). Part 0 also holds the embedding, the last part
    the head and the vocabulary-parallel loss. With tied embeddings on two ranks
    (the loop placement), those two share ``tok.weight`` and add each other's part of
    its gradient after the backward passes (the executor's tied exchange); a V holds
    both on rank 0."""
    parts = model_parts(schedule)
    by = _parts_text(schedule.name, schedule.stages, schedule.chunks)
    per_part = check_divisible("layers", len(gpt.blocks), parts, by=by)
    ids = tuple(schedule.virtual_stage(stage, c) for c in range(schedule.chunks))
    modules = {}
    for chunk, j in enumerate(ids):
        part = schedule.model_part(j)
        layers: list[nn.Module] = list(gpt.blocks[part * per_part : (part + 1) * per_part])
        if part == 0:
            layers.insert(0, StageEmbedding(gpt))
        if part == parts - 1:
            layers.append(StageHead(gpt))
        modules[chunk] = nn.Sequential(*layers)
    mirror = schedule.stages - 1 - stage if schedule.bidirectional else None
    tied, peer = [], None
    if gpt.config.tie_embeddings and mirror is None:  # the mirror exchange adds tied ones too
        last = schedule.stages * schedule.chunks - 1
        peer = tied_embedding_peer(stage, schedule.rank_of(0), schedule.rank_of(last))
        tied = [gpt.tok.weight] if peer is not None else []

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # in fp32 whatever the matmuls ran in (autocast does the same for F.cross_entropy)
        return vocab_parallel_cross_entropy(
            logits.float(), targets, gpt.comm, start=gpt.tok.start, vocab=gpt.config.vocab
        )

    return PipelineStage(
        stage, schedule.stages, modules, loss_fn, tied, peer, stage_ids=ids, mirror=mirror
    )


def dense_shard(name: str, dense: torch.Tensor, t: int, rank: int, vocab: int) -> torch.Tensor:
    """The slice of the dense GPT's parameter ``name`` that tensor-parallel rank
    ``rank`` of ``t`` holds in a :class:`ParallelGPT`: vocabulary rows (zero-padded)
    of ``tok.weight``/``head_weight``, :func:`block_shard` of a block's tensors,
    everything else whole. (Experts are whole on their expert-parallel rank: see
    :func:`distlab.parallel.moe.gpt.dense_expert_name` for their dense names.)"""
    if name.startswith("blocks."):
        return block_shard(name.split(".", 2)[2], dense, t, rank)
    if name in ("tok.weight", "head_weight", "head.weight"):
        start, stop, rows = vocab_shard(vocab, t, rank)
        padded = dense.new_zeros(rows, dense.shape[1])
        padded[: stop - start] = dense[start:stop]
        return padded
    return dense


def parallelize(
    model: GPT,
    layout: Layout,
    *,
    mesh: ParallelMesh | None = None,
    split: str = "zigzag",
    context: str = "ring",
    algorithm: str = "ring",
    seed: int = 0,
    precision: str = "fp32",
) -> ParallelModel:
    """Apply ``layout``'s parallelisms to ``model`` in :data:`ORDER` (module docstring).

    ``mesh``: the job's mesh (built from ``layout`` when omitted; every rank must call);
    ``split``: how sequences are cut over cp; ``context``: how the cp ranks attend over
    the whole sequence (a key of :data:`CONTEXT_ATTENTION`); ``algorithm``: the tensor-parallel
    all-reduce (:data:`distlab.parallel.comm.collectives.ALGORITHMS`).

    ``precision`` (:data:`PRECISIONS`): "bf16" or "fp16" computes in 16 bits as torch's
    automatic mixed precision does: the parameters stay fp32 (they are the master
    weights, and their gradients, reduced over tp, dp and cp, are fp32), and the loop
    runs the step under ``torch.autocast``, so each matmul runs on 16-bit copies. FSDP
    chunks get FSDP2's ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32)``:
    fp32 shards, 16-bit all-gathers, gradients reduce-scattered in fp32.

    Dropout (``model.config.dropout > 0``) with tp > 1 follows Megatron's RNG tracker
    (:mod:`distlab.parallel.tensor.rng`): the default random stream is reseeded with
    ``seed + 100 * pp_rank`` on every rank (alike on the tp ranks of a stage, so the
    replicated activations drop the same elements), and dropout inside the
    tensor-parallel region draws from a stream seeded per tp rank.

    ``model`` and ``layout`` are checked first (:func:`check_model`: a ``ValueError``
    naming what does not fit), before any process group is built."""
    schedule = check_model(model, layout, split=split, context=context)
    return parallelize_checked(
        model, layout, schedule, mesh=mesh, split=split, context=context, algorithm=algorithm,
        seed=seed, dtype=compute_dtype(precision),
    )  # fmt: skip


def parallelize_checked(
    model: GPT,
    layout: Layout,
    schedule: PipelineSchedule,
    *,
    mesh: ParallelMesh | None,
    split: str,
    context: str,
    algorithm: str,
    seed: int,
    dtype: torch.dtype | None,
) -> ParallelModel:
    """:func:`parallelize` of a ``model`` and ``layout`` that :func:`check_model` accepted,
    without checking them again: ``schedule`` is what it returned, ``dtype`` what
    :func:`compute_dtype` gave for the precision. :func:`~distlab.parallel.compose.train`
    checks once (:func:`~distlab.parallel.compose.loop.check_train`) and calls this."""
    if not dist.is_initialized():
        raise RuntimeError("no process group: call parallelize inside distlab.run(...)")
    mesh = build_mesh(layout) if mesh is None else mesh
    if mesh.layout != layout:
        raise ValueError(f"the mesh was built for {mesh.layout.label()}, not {layout.label()}")
    where, context_groups = mesh.coordinates, []
    comm = TensorParallelComm(algorithm, group=mesh["tp"])  # 1. tensor
    rng = None
    if model.config.dropout and layout.tp > 1:
        rng = RNGTracker(seed + 100 * where["pp"], where["tp"])
        rng.seed_default()
    cp_split = (layout.cp, where["cp"], split) if layout.cp > 1 else None  # 2. context
    gpt = ParallelGPT(
        model, comm, sequence_parallel=layout.sequence_parallel, context=cp_split,
        make_block=_block_maker(layout, mesh, context_groups, split, context, algorithm, rng),  # 2. and 3. expert
    )  # fmt: skip
    stage = cut_stage(gpt, where["pp"], schedule)  # 4. pipeline
    if layout.recompute == "full":  # each block keeps only its input (Korthikanti, Table 2)
        for chunk, module in list(stage.chunks.items()):
            stage.chunks[chunk] = nn.Sequential(*(
                RecomputedBlock(layer, rng) if isinstance(layer, BLOCKS) else layer
                for layer in module
            ))  # fmt: skip
    wrappers = []
    if layout.fsdp:  # 5. data: FSDP; ZeRO-1/2 and plain averaging live in the optimizer step
        policy = MixedPrecisionPolicy(
            param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None
        )
        for chunk, module in list(stage.chunks.items()):
            wrapper = FSDP(
                module, group=mesh["dp-cp"], wrap="layer", algorithm=algorithm,
                mixed_precision=policy,
            )  # fmt: skip
            stage.chunks[chunk] = wrapper
            wrappers.append(wrapper)
    return ParallelModel(layout, mesh, gpt, stage, schedule, wrappers, context_groups)
