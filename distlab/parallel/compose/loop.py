"""One training loop for every layout: :func:`train`.

Each step, on every rank::

    zero the gradients
    run the pipeline schedule on this rank's micro-batches      (forward + backward;
        tensor, context and expert parallelism communicate inside the layers)
    sum the sequence-parallel gradients over tp                 (ParallelGPT.finish_gradients)
    reduce the gradients over the data-parallel ranks           (zero_stage 0: average over
        dp-cp, experts summed over expert_dp / (dp cp); ZeRO-1/2: inside the optimizer
        step; FSDP: reduce-scattered during backward)
    optimizer step                                              (SGD, momentum SGD or Adam)

**The data.** Replica r (its ``"dp"`` coordinate) takes sequences r b/dp .. (r+1) b/dp - 1;
within a replica, context-parallel rank c takes its part of every sequence
(:func:`~distlab.parallel.context.ring.split_sequence`); the pipeline cuts them into
``layout.micro_batches``. Each rank's loss is the mean over its tokens and every
rank of the dp-cp group has as many, so the mean over the group is the loss of the
whole batch, and averaging the gradients over dp-cp gives its gradient: a step
equals one single-process step on the whole batch, up to fp32 rounding.

**MoE.** The loss adds ``aux_weight`` times the layers' load-balancing losses. Each
chunk adds its own layers' term as a side loss of the pipeline executor
(``PipelineStage.side_loss``), so with ``pp > 1`` an earlier stage's balancing loss
trains that stage's routers, as in one process; the loss reported is then summed
over the pipeline's ranks. Each micro-batch of each replica (and with cp > 1 each
cp rank's tokens) is one routing group with its own capacity. ``ComposedRun.moe_kept``
reports, per step, how many assignments each forward's MoE layers kept
(:class:`KeptAssignments`): what they keep for backward depends on it
(:mod:`distlab.calc.run_activations`).

**Where the loss is.** The rank that holds the last virtual stage computes the loss:
the last pipeline rank, rank 0 of a V (ZB-V, DualPipeV), and for DualPipe both ends
(each for the micro-batches its direction finishes, summed over the pipeline).

**Precision** (``precision="bf16"`` or ``"fp16"``): the step runs under
``torch.autocast``, so matmuls run in 16 bits on 16-bit copies of the fp32
parameters, which are the master weights (the optimizer steps them as in fp32;
their gradients are fp32, so every reduction over tp, dp, cp and the pipeline is
fp32); FSDP gathers 16-bit copies of its fp32 shards (:func:`~.model.parallelize`).
The loss is computed in fp32. fp16 adds dynamic loss scaling (Micikevicius et al.
2018, Section 3.2; ``loss_scaler``, default :class:`DynamicLossScaler`): each loss
is multiplied by the scale before backward; before the optimizer step every rank
checks its own gradients (ZeRO-2 and FSDP: its shards) for inf/NaN and one
all-reduce over the whole job (a 4-byte flag, not in the per-group trace) tells
every rank whether any overflowed, so every rank of every stage skips the same
steps (``ComposedRun.skipped_steps``) and halves the scale alike; otherwise the
gradients are divided by the scale and the step goes on. A checkpoint keeps the
scaler's state (scale and good steps), so a resumed fp16 run scales, and skips, as the
uninterrupted one.

**Agreement.** Before it builds a process group, :func:`train` checks that every rank
got the same model and arguments: the layout field by field, steps, lr, the optimizer
and its settings, aux_weight, split, context, algorithm, the batch (dtype, shape and a
SHA-256 of tokens and of targets), the checkpoint arguments, the model's config and
parameters (:func:`~distlab.parallel.comm.agreement.check_same_across_ranks`, two small
all-gathers per call). A rank with another layout or step count would otherwise hang
the others; one with another batch or lr would train silently wrong. Each rank's own
bad value (a batch that dp * micro_batches does not divide) is refused before that,
on that rank, by name: :func:`check_train` checks the layout against the model and the
batch, once (``parallelize`` is then called without checking them again).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from distlab.core.checks import nonnegative, positive, positive_int
from distlab.core.layout import Layout
from distlab.core.ranks import GROUP_NAMES
from distlab.models import GPT, check_batch
from distlab.parallel.comm.agreement import check_same_across_ranks, parameters
from distlab.parallel.comm.collectives import Collectives
from distlab.parallel.comm.trace import name_groups, trace_comm
from distlab.parallel.context.ring import split_sequence
from distlab.parallel.moe.gpt import MoELayerStats, moe_layers, routing_stats
from distlab.parallel.moe.layer import average_moe_gradients
from distlab.parallel.pipeline import PipelineSchedule, run_pipeline
from distlab.parallel.precision.memory import optimizer_state_tensors, storage_bytes
from distlab.parallel.precision.mixed_precision import DynamicLossScaler, grads_are_finite
from distlab.parallel.tensor.checks import check_divisible
from distlab.parallel.zero.optimizer import ZeroOptimizer

from .checkpoint import check_save_after, load_checkpoint, save_checkpoint
from .model import ParallelModel, check_model, compute_dtype, parallelize_checked

#: optimizer name -> (torch class, its keyword arguments, the
#: :data:`distlab.calc.memory.RECIPES` entry whose bytes per parameter it keeps)
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {}, "sgd"),
    "sgd_momentum": (torch.optim.SGD, {"momentum": 0.9}, "sgd_momentum"),
    "adam": (torch.optim.Adam, {}, "fp32_adam"),
}


@dataclass
class ComposedRun:
    """What one rank of :func:`train` returns."""

    rank: int
    layout: Layout
    coordinates: dict[str, int]  # {"tp": .., "cp": .., "dp": .., "pp": .., "ep": .., ...}
    losses: list[float] | None  # whole-batch loss per step, on the ranks holding the loss
    shards: dict[str, torch.Tensor]  # this rank's final parameters, by ParallelGPT name
    parameters: int  # elements of this rank's (tp, cp, ep, pp) share of the model
    optimizer_state_bytes: int  # measured: the storages of the optimizer's state tensors
    model_state_bytes: int  # measured: parameters + gradients + optimizer state, at the end
    step_seconds: list[float]  # wall time of each step on this rank
    peak_activation_bytes: int  # the most the pipeline executor held for backward
    bytes_by_group: list[dict[str, int]] = field(default_factory=list)  # per step, wire bytes
    moe_stats: list[list[MoELayerStats]] = field(default_factory=list)  # per step, per MoE layer
    # per step: the assignments each forward's MoE layers kept, by (chunk, micro-batch)
    moe_kept: list[dict[tuple[int, int], int]] = field(default_factory=list)
    precision: str = "fp32"
    skipped_steps: list[int] = field(default_factory=list)  # fp16: steps skipped on overflow


class PlainSGD:
    """SGD without momentum, written out: ``p -= lr * p.grad``, what ``torch.optim.SGD(params, lr)``
    computes, with no state.

    Why not ``torch.optim.SGD``: its first ``zero_grad``/``step`` imports ``torch._dynamo``
    (and sympy), about 70 MB per process; the 8 ranks of notebook 09 on a 2 GB machine
    (Binder) cannot afford it. Momentum, Adam, ZeRO and FSDP still use torch's optimizers."""

    def __init__(self, params, lr: float) -> None:
        self.params, self.lr, self.state = list(params), lr, {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


def make_optimizer(parallel: ParallelModel, name: str, lr: float):
    """``(optimizer, torch optimizer holding the state)`` for this rank's share.

    ZeRO-1/2: :class:`~distlab.parallel.zero.optimizer.ZeroOptimizer` over dp-cp (it
    reduce-scatters the gradients, updates this rank's 1/(dp cp) of the stage's
    flattened parameters and all-gathers them). FSDP: torch's optimizer on the shards."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(map(repr, OPTIMIZERS))}")
    torch_class, kwargs, _ = OPTIMIZERS[name]
    zero_stage = parallel.layout.zero_stage
    if zero_stage in (1, 2):
        chunks = torch.nn.ModuleList(parallel.stage.chunks.values())
        group = parallel.mesh["dp-cp"]
        zero = ZeroOptimizer(chunks, torch_class, stage=zero_stage, group=group, lr=lr, **kwargs)
        return zero, zero.optimizer
    if name == "sgd":
        optimizer = PlainSGD(parallel.parameters(), lr=lr)
    else:
        optimizer = torch_class(parallel.parameters(), lr=lr, **kwargs)
    return optimizer, optimizer


def _scale_losses(stage, scaler) -> None:
    """Multiply the stage's loss and side losses by ``scaler.scale`` (read at each call)."""
    loss_of_tokens, side_loss = stage.loss_fn, stage.side_loss
    stage.loss_fn = lambda logits, t: loss_of_tokens(logits, t) * scaler.scale
    if side_loss is not None:
        stage.side_loss = lambda chunk: (
            None if (side := side_loss(chunk)) is None else side * scaler.scale
        )


class KeptAssignments:
    """How many (token, expert) assignments the MoE layers of each forward kept, by
    (chunk, micro-batch), for one step at a time (:meth:`take`): the one part of what a
    MoE layer keeps for backward that the routing decides (the indices ``combine``
    scatters the kept gates with; :mod:`distlab.calc.run_activations`).

    A forward hook on each chunk holding MoE layers reads their routing after the chunk's
    forward; the executor runs a chunk forward once per ``F`` action (a recomputed block
    routes again inside backward, not through the chunk), so the chunk's n-th forward of a
    step is micro-batch ``order[chunk][n]``, its n-th ``F`` in this rank's schedule."""

    def __init__(self, parallel: ParallelModel, stage: int) -> None:
        self.order: dict[int, list[int]] = {}
        for action in parallel.schedule.ranks[stage]:
            if action.kind == "F":
                self.order.setdefault(action.chunk, []).append(action.micro_batch)
        self.step: dict[tuple[int, int], int] = {}
        self.handles = [
            module.register_forward_hook(self._recorder(chunk, layers))
            for chunk, module in parallel.stage.chunks.items()
            if (layers := moe_layers(module))
        ]

    def _recorder(self, chunk: int, layers: list):
        def record(module, inputs, output) -> None:
            done = sum(1 for c, _ in self.step if c == chunk)
            kept = sum(int(layer.routing.kept.sum()) for layer in layers)
            self.step[(chunk, self.order[chunk][done])] = kept

        return record

    def take(self) -> dict[tuple[int, int], int]:
        """This step's counts; the next step starts empty."""
        step, self.step = self.step, {}
        return step

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def loss_ranks(schedule) -> tuple[int, ...]:
    """The pipeline ranks that compute the loss: the one holding the last virtual stage,
    and for DualPipe also the one ending the other direction's route."""
    n = schedule.stages * schedule.chunks
    last = {schedule.rank_of(n - 1)}
    if schedule.bidirectional:
        last.add(schedule.rank_of(n // 2 - 1))
    return tuple(sorted(last))


def balancing_loss(parallel: ParallelModel, chunk: int, weight: float) -> torch.Tensor | None:
    """``weight`` times the load-balancing losses chunk ``chunk``'s MoE layers left from its
    forward, or ``None`` if it has none (the executor's side loss)."""
    layers = moe_layers(parallel.stage.chunks[chunk])
    if not layers:
        return None
    return weight * sum(layer.aux_loss for layer in layers)


def unscale_or_skip(parallel: ParallelModel, step_with, scaler) -> bool:
    """fp16's dynamic loss scaling, between backward and the optimizer step: ``True`` with
    this rank's gradients divided by the scale, or ``False`` when a gradient overflowed
    on any rank of the job (then every rank skips this step). The scaler backs off or
    grows alike on every rank."""
    grads = [p.grad for p in parallel.parameters() if p.grad is not None]
    grads += list(getattr(step_with, "grad_shards", []))  # ZeRO-2: only its shards are left
    device = parallel.parameters()[0].device
    flag = torch.tensor([0.0 if grads_are_finite(grads) else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every stage too: all ranks skip alike
    found_inf, scale = bool(flag.item()), scaler.scale
    scaler.update(found_inf)
    if found_inf:
        return False
    for grad in grads:
        grad.div_(scale)
    return True


def my_batch(tokens: torch.Tensor, layout: Layout, coordinates: dict, split: str) -> torch.Tensor:
    """This rank's part of a ``(b, s)`` batch: its replica's b/dp sequences, its cp part of each."""
    mine = tokens.chunk(layout.dp)[coordinates["dp"]]
    if layout.cp > 1:
        mine = split_sequence(mine, 1, layout.cp, coordinates["cp"], split)
    return mine


def _bytes_by_group(trace) -> dict[str, int]:
    """Wire bytes this rank sent in the traced step, by group name (the ring's K/V
    passes are traced as "cp" sends)."""
    sent: Counter = Counter()
    for call in trace.calls:
        sent[call.group] += call.wire_bytes
    return dict(sent)


def final_parameters(parallel: ParallelModel) -> dict[str, torch.Tensor]:
    """This rank's parameters by :class:`ParallelGPT` name (collective under FSDP: each
    unit's shards are all-gathered over dp-cp, so every rank holds its stage's whole share)."""
    full: dict[int, torch.Tensor] = {}
    for wrapper in parallel.fsdp:
        for unit in wrapper.units:
            flat = torch.empty(unit.group.padded_numel, dtype=unit.shard.dtype)
            wrapper.comm.all_gather(flat, unit.shard.detach())
            for p, view in zip(unit.params, unit.group.views(flat), strict=True):
                full[id(p)] = view.clone()
    stage_params = [p for m in parallel.stage.chunks.values() for p in m.parameters()]
    mine = {id(p) for p in stage_params} | set(full)
    return {
        name: full[id(p)] if id(p) in full else p.detach().clone()
        for name, p in parallel.gpt.named_parameters()
        if id(p) in mine
    }


def _state_tensors(parallel: ParallelModel, step_with, holder) -> list[torch.Tensor]:
    """Parameters, gradients (ZeRO-2: its gradient shards) and optimizer state of this rank."""
    params = parallel.parameters()
    states, _ = optimizer_state_tensors(holder)
    grad_shards = getattr(step_with, "grad_shards", [])  # ZeroOptimizer at stage 2
    return [*params, *(p.grad for p in params), *grad_shards, *states]


def check_train(
    model: GPT,
    layout: Layout,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *,
    split: str = "zigzag",
    context: str = "ring",
) -> PipelineSchedule:
    """The one check of :func:`train`'s model, layout and batch, on this rank, before any
    process group is built: the pipeline schedule ``layout`` names, or an error naming
    the value. The batch against the model (:func:`~distlab.models.check_batch`: token
    ids, shapes, ``seq_len``), the layout against the model (:func:`~.model.check_model`:
    tp, cp, ep, pp and the schedule against heads, hidden, layers, the sequence and the
    experts, and the refused combinations), and the batch against the layout: dp *
    micro_batches | b (each replica's b / dp sequences cut into equal micro-batches)."""
    check_batch(tokens, targets, model.config)
    schedule = check_model(model, layout, split=split, context=context)
    check_divisible(
        "batch", tokens.shape[0], layout.dp * layout.micro_batches, by="dp * micro_batches"
    )
    return schedule


def train(
    model: GPT,
    layout: Layout,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *,
    steps: int,
    lr: float,
    optimizer: str = "sgd",
    aux_weight: float = 0.0,
    split: str = "zigzag",
    context: str = "ring",
    algorithm: str = "ring",
    save_to: str | None = None,
    save_after: int | None = None,
    resume_from: str | None = None,
    precision: str = "fp32",
    loss_scaler: DynamicLossScaler | None = None,
) -> ComposedRun:
    """Train ``model`` (the same plain GPT or MoEGPT on every rank) under ``layout`` for
    ``steps`` steps on the batch ``tokens``/``targets`` (b sequences, the same on every
    rank); see the module docstring. Call on every rank inside ``distlab.run``.

    ``optimizer``: a key of :data:`OPTIMIZERS`; ``aux_weight``: the MoE balancing loss's
    weight; ``split``: how sequences are cut over cp; ``context``: the cp ranks' attention
    ("ring", "all_gather" or "ulysses"); ``algorithm``: distlab's all-reduce
    for tp and dp (:data:`distlab.parallel.comm.collectives.ALGORITHMS`); ``precision``: "fp32",
    "bf16" or "fp16" (module docstring), ``loss_scaler``: fp16's scaler (default
    ``DynamicLossScaler()``; only with fp16).

    Checkpoints (:mod:`.checkpoint`, any layout): ``resume_from``: a checkpoint folder
    loaded before the first step (``steps`` then counts the steps still to run);
    ``save_to`` with ``save_after``: save to that folder after step ``save_after``
    (counted from the start of training) and go on.

    Every rank raises the same ``ValueError`` naming the first of these that differs
    across ranks ("lr differs across ranks: rank 0: 0.1, rank 3: 0.2"), before the first
    process group is built."""
    steps, lr = positive_int("steps", steps), positive("lr", lr)
    aux_weight = nonnegative("aux_weight", aux_weight)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    dtype = compute_dtype(precision)
    if loss_scaler is not None and dtype is not torch.float16:
        raise ValueError(f"loss_scaler is for precision='fp16', got precision={precision!r}")
    if dtype is torch.float16:
        loss_scaler = DynamicLossScaler() if loss_scaler is None else loss_scaler
    schedule = check_train(model, layout, tokens, targets, split=split, context=context)
    check_same_across_ranks(
        {
            "layout": layout,
            "steps": steps,
            "lr": lr,
            "optimizer": optimizer,
            "the optimizer's settings": OPTIMIZERS[optimizer][:2],
            "aux_weight": aux_weight,
            "split": split,
            "context": context,
            "algorithm": algorithm,
            "the batch (tokens)": tokens,
            "the batch (targets)": targets,
            "save_to": save_to,
            "save_after": save_after,
            "resume_from": resume_from,
            "precision": precision,
            "the loss scale": None if loss_scaler is None else loss_scaler.scale,
            "the model's config": model.config,
            "the model's MoE config": getattr(model, "moe_config", None),
            **parameters("the model", model),
        },
        hint="every rank must call train with the same model and arguments",
    )
    parallel = parallelize_checked(
        model, layout, schedule, mesh=None, split=split, context=context, algorithm=algorithm,
        seed=0, dtype=dtype,
    )  # fmt: skip
    mesh, where = parallel.mesh, parallel.mesh.coordinates
    if aux_weight:
        parallel.stage.side_loss = lambda chunk: balancing_loss(parallel, chunk, aux_weight)
    if loss_scaler is not None:  # fp16: backward starts from the scaled losses
        _scale_losses(parallel.stage, loss_scaler)
    step_with, state_holder = make_optimizer(parallel, optimizer, lr)
    done = (
        0 if resume_from is None
        else load_checkpoint(resume_from, parallel, step_with, model, loss_scaler)
    )  # fmt: skip
    check_save_after(save_to, save_after, done, steps)
    my_tokens, my_targets = (my_batch(t, layout, where, split) for t in (tokens, targets))
    data_parallel = Collectives(algorithm, group=mesh["dp-cp"])
    losses, step_seconds, peak, sent, stats, skipped = [], [], 0, [], [], []
    autocast = (
        torch.autocast(parallel.parameters()[0].device.type, dtype=dtype)
        if dtype is not None
        else contextlib.nullcontext()
    )
    my_moe_layers = moe_layers(torch.nn.ModuleList(parallel.stage.chunks.values()))
    kept_by_forward, kept = KeptAssignments(parallel, where["pp"]), []
    holds_loss = where["pp"] in loss_ranks(parallel.schedule)
    spread = layout.pp > 1 and (aux_weight > 0 or parallel.schedule.bidirectional)
    for step in range(done + 1, done + steps + 1):
        start = time.perf_counter()
        scale = 1.0 if loss_scaler is None else loss_scaler.scale  # this step's loss scale
        with trace_comm() as trace:
            name_groups({name: mesh[name] for name in GROUP_NAMES})
            step_with.zero_grad(set_to_none=True)
            with autocast:
                run = run_pipeline(
                    parallel.schedule, parallel.stage, my_tokens, my_targets,
                    stage_ranks=mesh.ranks("pp"),
                )  # fmt: skip
            parallel.finish_gradients()
            if layout.zero_stage == 0:
                modules = torch.nn.ModuleList(parallel.stage.chunks.values())
                average_moe_gradients(modules, mesh, algorithm=algorithm)
            if loss_scaler is None or unscale_or_skip(parallel, step_with, loss_scaler):
                step_with.step()
            else:
                skipped.append(step)
        sent.append(_bytes_by_group(trace))
        stats.append([routing_stats(layer) for layer in my_moe_layers])  # the last micro-batch
        kept.append(kept_by_forward.take())
        loss = torch.tensor([(run.loss or 0.0) / scale], dtype=torch.float64)
        if spread:  # side losses on every stage, or DualPipe's two ends
            dist.all_reduce(loss, group=mesh["pp"])
        if holds_loss:
            data_parallel.all_reduce_mean_(loss)
            losses.append(loss.item())
        step_seconds.append(time.perf_counter() - start)
        peak = max(peak, run.peak_activation_bytes)
        if step == save_after:
            save_checkpoint(save_to, parallel, step_with, model, step=step,
                            loss_scaler=loss_scaler)  # fmt: skip
    kept_by_forward.close()
    shards = final_parameters(parallel)
    states, _ = optimizer_state_tensors(state_holder)
    return ComposedRun(
        rank=dist.get_rank(),
        layout=layout,
        coordinates=where,
        losses=losses if holds_loss else None,
        shards=shards,
        parameters=sum(t.numel() for t in shards.values()),
        optimizer_state_bytes=storage_bytes(states),
        model_state_bytes=storage_bytes(_state_tensors(parallel, step_with, state_holder)),
        step_seconds=step_seconds,
        peak_activation_bytes=peak,
        bytes_by_group=sent,
        moe_stats=stats,
        moe_kept=kept,
        precision=precision,
        skipped_steps=skipped,
    )
