"""What one rank holds in a pipeline: its model chunks, and which one is first or last.

Chunk c of rank r is virtual stage j = c p + r (one chunk per rank unless the
schedule is interleaved), or, with the V-shaped placement of ZB-V and
DualPipeV, stage r (chunk 0) and 2p - 1 - r (chunk 1): the schedule's
``stage_to_rank`` (:func:`distlab.core.pipeline_schedule.stage_to_rank`).
The first virtual stage reads the input tokens, the last one computes the
loss; with the V both are on rank 0. :func:`gpt_stage` cuts the tiny GPT of
:mod:`distlab.models` with :func:`~distlab.parallel.pipeline.partition.balanced_split`.

A GPT with tied embeddings uses one weight in its first layer (token
embedding) and its last (the head), which live on rank 0 and rank p - 1.
Each of those two ranks gets only its own part of that weight's gradient,
so after the backward passes they add each other's part, as Megatron-LM's
embedding group does (Shoeybi et al. 2019; Narayanan et al. 2021, Section 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from distlab.core.checks import int_in, positive_int
from distlab.core.pipeline_schedule import stage_to_rank
from distlab.models import GPT

from .partition import balanced_split, gpt_layers, measured_costs, parameter_costs

BALANCE = ("params", "time")


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token, as :meth:`distlab.models.GPT.loss`."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@dataclass
class PipelineStage:
    """Rank ``rank``'s chunks of a model cut into ``stages * num_chunks`` virtual stages.

    ``stage_ids[c]``: the virtual stage chunk c runs; ``None`` means the loop
    placement, c p + r. ``mirror``: for DualPipe, the rank that holds the same
    model parts in the other direction's copy; after the backward the two add
    each other's gradients (every parameter, in ``parameters()`` order).
    ``side_loss``: a loss term a chunk's forward leaves behind (the MoE load-balancing
    loss of its layers): ``side_loss(c)`` is called after chunk c's forward and returns
    a scalar (or ``None``); it is added to the step's loss (divided by m, like the
    main loss) and its gradient flows back through chunk c only, so every stage's own
    term trains its own layers, whichever rank computes the main loss."""

    rank: int
    stages: int
    chunks: dict[int, nn.Module]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = next_token_loss
    tied: list[nn.Parameter] = field(default_factory=list)
    tied_peer: int | None = None
    stage_ids: tuple[int, ...] | None = None
    mirror: int | None = None
    side_loss: Callable[[int], torch.Tensor | None] | None = None

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    def virtual_stage(self, chunk: int) -> int:
        if self.stage_ids is not None:
            return self.stage_ids[chunk]
        return chunk * self.stages + self.rank

    def is_first(self, chunk: int) -> bool:
        return self.virtual_stage(chunk) == 0

    def is_last(self, chunk: int) -> bool:
        return self.virtual_stage(chunk) == self.stages * self.num_chunks - 1

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, each once, chunk by chunk in virtual-stage order (for
        DualPipe in model-part order, so that a rank and its mirror list them alike)."""
        n = self.stages * self.num_chunks

        def order(chunk: int) -> int:
            j = self.virtual_stage(chunk)
            return j % (n // 2) if self.mirror is not None else j

        seen: dict[int, nn.Parameter] = {}
        for chunk in sorted(self.chunks, key=order):
            for p in self.chunks[chunk].parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())


def tied_embedding_peer(rank: int, first: int, last: int) -> int | None:
    """The rank that ``rank`` swaps its part of a tied embedding's gradient with: the rank
    holding the first virtual stage (the embedding) and the one holding the last (the
    head) exchange theirs after the backward passes; ``None`` for any other rank, or
    when one rank holds both (Narayanan et al. 2021, Section 3)."""
    if first == last or rank not in (first, last):
        return None
    return first + last - rank


def gpt_stage(
    model: GPT,
    rank: int,
    stages: int,
    *,
    chunks: int = 1,
    balance: str | Sequence[range] = "params",
    sample: torch.Tensor | None = None,
    placement: str = "loop",
    bidirectional: bool = False,
) -> PipelineStage:
    """Rank ``rank``'s part of ``model``, cut into ``stages * chunks`` virtual stages.

    ``balance``: ``"params"`` (equal parameter counts), ``"time"`` (equal
    measured forward + backward time on ``sample`` tokens, the same on every
    rank only if the timings agree: pass the cut to every rank instead when
    in doubt), or the cut itself, a list of ``range`` s of layer indices
    (:func:`~distlab.parallel.pipeline.partition.gpt_layers` order).
    ``placement``: ``"loop"`` or ``"v"`` (ZB-V, DualPipeV: rank r holds stages r
    and 2p - 1 - r), as :func:`~distlab.core.pipeline_schedule.stage_to_rank`.
    ``bidirectional`` (DualPipe, V placement, 2 chunks): the model is cut in p
    parts, and rank r holds part r (going down) and part p - 1 - r (going up),
    both copies of rank p - 1 - r's, its ``mirror``.
    """
    stages, chunks = positive_int("stages", stages), positive_int("chunks", chunks)
    rank = int_in("rank (the stage)", rank, 0, stages - 1)
    layers = gpt_layers(model)
    if bidirectional and (placement != "v" or chunks != 2 or stages % 2):
        raise ValueError(
            f"bidirectional (DualPipe) needs placement='v', chunks=2 and an even number of "
            f"stages; got placement={placement!r}, chunks={chunks}, stages={stages}"
        )
    parts = stages * chunks // (2 if bidirectional else 1)
    if isinstance(balance, str):
        if balance not in BALANCE:
            raise ValueError(f"unknown balance {balance!r}; allowed: {BALANCE} or a list of ranges")
        if balance == "time" and sample is None:
            raise ValueError("balance='time' needs sample tokens to time the layers on")
        costs = parameter_costs(layers) if balance == "params" else measured_costs(layers, sample)
        cut = balanced_split(costs, parts)
    else:
        cut = list(balance)
        covered = [i for r in cut for i in r]
        if len(cut) != parts or covered != list(range(len(layers))):
            raise ValueError(
                f"balance must cut layers 0..{len(layers) - 1} in order into {parts} ranges, "
                f"got {cut}"
            )
    owner = stage_to_rank(stages, chunks, placement)
    ids = tuple(j for j, r in enumerate(owner) if r == rank)
    mine = {c: nn.Sequential(*(layers[i] for i in cut[j % parts])) for c, j in enumerate(ids)}
    tied, peer = [], None
    mirror = stages - 1 - rank if bidirectional else None  # adds every gradient, tied ones too
    if model.head.weight is model.tok.weight and mirror is None:
        peer = tied_embedding_peer(rank, owner[0], owner[-1])
        tied = [model.tok.weight] if peer is not None else []
    return PipelineStage(
        rank, stages, mine, tied=tied, tied_peer=peer, stage_ids=ids, mirror=mirror
    )
