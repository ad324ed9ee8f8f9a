"""Checkpoints of any layout: save a composed run, resume it bit for bit, or load it into another.

A run of :func:`~distlab.parallel.compose.train` holds its model in pieces: a
tensor-parallel slice (rows or columns of a matrix, vocabulary rows padded with
zeros), on one pipeline stage, with experts numbered per expert-parallel rank,
and under ZeRO or FSDP cut once more into flat shards over dp-cp. The checkpoint
forgets all of that and keys everything by the **dense model's parameter
names**, so it loads into any layout the model can run under.

**The format** (a folder ``PATH``)::

    PATH/COMMIT.json              the commit: names the data folder, SHA-256 of every file
    PATH/data-<token>/manifest.json   format, step, the layout it was written from, the
                                  model's config, every dense parameter's shape, and
                                  where each piece of it lies (file, key, box)
    PATH/data-<token>/rank-00003.pt   the pieces rank 3 writes, and rank 3's RNG state

A **piece** is what one tensor-parallel rank holds of a dense parameter, without
its padding: a box ``[lo, hi)`` per dimension of the dense tensor (all of it for a
LayerNorm, rows ``t0 .. t1`` of ``tok.weight``, columns of ``attn.proj.weight``),
with the optimizer's state for the same box (momentum, Adam's m and v) and its
scalars (Adam's step). Each piece is written **once**: of the ranks that hold it
(the dp and cp replicas, the expert-data-parallel replicas of an expert, the tp
ranks of a replicated LayerNorm) one writes it, chosen round-robin so every rank
writes a share. A tied embedding cut over pipeline stages is two tensors in the
run: the first and the last stage each update their own copy, and the two agree
only up to rounding (the data-parallel reduction adds in an order that depends
on where the copy lies in its flat buffer), so the last stage's is stored as
``head.weight`` and a layout that holds both on one stage loads ``tok.weight``. ZeRO
and FSDP shards are first all-gathered over dp-cp into the tensor-parallel slice
(each rank's share of that gather is its shard).

Where a piece lies is not a second copy of the tensor-parallel rules: the saver
applies :func:`~distlab.parallel.compose.dense_shard` (the one rule
``parallelize`` slices with) to a tensor of element numbers ``1 .. n`` of the
dense shape, reads the box off it and checks that it is one. A loader puts the
pieces of a name together into the dense tensor and applies ``dense_shard`` for
its own tp rank; experts are found by their dense index
(:func:`~distlab.parallel.moe.gpt.dense_expert_name`); ZeRO/FSDP layouts then
flatten and keep their own shard.

**Resume.** The step count is saved; every rank's CPU generator state is saved
and restored when the checkpoint is loaded into the layout it was written from
(same layout, same rank: the same dropout masks follow). In another layout a
rank has no counterpart, so the generators are left alone: a run without dropout
continues equal up to rounding, one with dropout continues with other masks.
Hyperparameters (``lr``) come from the caller.

**Safety** (:mod:`distlab.parallel.checkpoint.files`): the files go to a fresh
data folder, every file is fsynced, then rank 0 publishes ``COMMIT.json`` with one
atomic rename and only afterwards removes the previous data folder: a save that
dies half way leaves the previous checkpoint loadable. A load verifies every
file's SHA-256 first (:func:`~distlab.parallel.checkpoint.data_parallel.verify_sharded`) and
refuses a missing, torn or damaged checkpoint, one of another kind, another
model or another optimizer, naming the file (the data folder, if the commit names
one that is gone) or the value.
:func:`~distlab.parallel.checkpoint.data_parallel.latest_verified_checkpoint` picks the newest
``step-N`` of a run that verifies, to restart from.

**Why not torch.distributed.checkpoint (DCP).** DCP stores a tensor as
rectangular chunks of one global shape (a ``DTensor``). Two of the pieces here
are not that: a ZeRO/FSDP flat shard runs across the end of one parameter into
the next (and through a row-parallel matrix's columns), and a vocabulary slice
carries padding rows that are no part of the dense tensor. Describing them needs
the all-gather and un-padding above anyway, after which each piece *is* one
rectangle and a ``torch.save`` per rank with a JSON index is all that is left,
readable in one sitting; a DCP version would also need a ``DeviceMesh`` rebuilt
for the layout's group order (and torch's ``DTensor`` import, about 70 MB a
process). The price: a loader reads the whole dense tensor of each name it holds
(not only its rectangle), fine for the models of this course.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from distlab.models import GPT
from distlab.parallel.checkpoint import files
from distlab.parallel.checkpoint.data_parallel import verify_sharded
from distlab.parallel.checkpoint.files import CheckpointError
from distlab.parallel.moe.gpt import dense_expert_name
from distlab.parallel.zero.optimizer import ZeroOptimizer

from .blocks import StageEmbedding, StageHead
from .model import ParallelModel, dense_shard

__all__ = [
    "CheckpointError",
    "check_save_after",
    "load_checkpoint",
    "read_manifest",
    "save_checkpoint",
]

FORMAT = "distlab-layout-checkpoint/1"
MANIFEST = "manifest.json"

Box = tuple[tuple[int, int], ...]  # [lo, hi) in each dimension of the dense tensor


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _per_element(value) -> bool:
    """An optimizer state entry shaped like its parameter (momentum, Adam's m and v),
    not a scalar (Adam's step)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


# ------------------------------------------------------------ names and boxes ---


def _trained_parameters(parallel: ParallelModel) -> dict[str, nn.Parameter]:
    """This rank's trained parameters by :class:`ParallelGPT` name (its stage's; under
    FSDP the parameters inside the units, not the flat shards)."""
    if parallel.fsdp:
        mine = {id(p) for w in parallel.fsdp for u in w.units for p in u.params}
    else:
        mine = {id(p) for m in parallel.stage.chunks.values() for p in m.parameters()}
    return {n: p for n, p in parallel.gpt.named_parameters() if id(p) in mine}


def _holds_only_the_head(parallel: ParallelModel) -> bool:
    """This rank's stage has the output layer but not the embedding (pp > 1)."""
    kinds = {type(m) for chunk in parallel.stage.chunks.values() for m in chunk.modules()}
    return StageHead in kinds and StageEmbedding not in kinds


def _dense_name(name: str, parallel: ParallelModel, dense: GPT) -> str:
    """The dense model's name of parallel parameter ``name``: ``head.weight`` for the
    untied output layer, and for a tied one on the last of several pipeline stages
    (its own copy there, see the module docstring); experts by their dense index."""
    if name == "head_weight" or (name == "tok.weight" and _holds_only_the_head(parallel)):
        name = "head.weight"
    moe = getattr(dense, "moe_config", None)
    if moe is not None:
        local_experts = moe.num_experts // parallel.layout.ep
        name = dense_expert_name(name, parallel.mesh.coordinates["ep"], local_experts)
    return name


def _slice(parallel: ParallelModel, dense: GPT, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``dense_shard`` of ``tensor`` (dense shape) for this rank's tp coordinate."""
    tp_rank = parallel.mesh.coordinates["tp"]
    return dense_shard(name, tensor, parallel.layout.tp, tp_rank, dense.config.vocab)


def _box(parallel: ParallelModel, dense: GPT, name: str, shape) -> tuple[Box, torch.Tensor]:
    """(the box of the dense tensor this rank's slice of ``name`` holds, the mask of its
    elements that are not padding), read off ``dense_shard`` of element numbers 1..n."""
    numbers = torch.arange(1, torch.Size(shape).numel() + 1).reshape(shape)
    local = _slice(parallel, dense, name, numbers)
    real = local > 0
    where = torch.stack(torch.unravel_index(local[real] - 1, shape), dim=1)
    box = tuple((int(lo), int(hi) + 1) for lo, hi in zip(where.min(0).values, where.max(0).values))
    inside = numbers[tuple(slice(lo, hi) for lo, hi in box)].reshape(-1)
    if not torch.equal(inside, local[real]):
        raise RuntimeError(f"the tensor-parallel slice of {name} is not a box of the dense tensor")
    return box, real


def _box_key(name: str, box: Box) -> str:
    """``"blocks.0.attn.q.weight[0:16,0:32]"``: a piece's key in its rank file."""
    return f"{name}[{','.join(f'{lo}:{hi}' for lo, hi in box)}]"


# ------------------------------------------------------ this rank's state ---


def _flat_parts(parallel: ParallelModel, optimizer) -> list[tuple]:
    """(comm, flat group, master, torch optimizer) of each flat group under ZeRO or FSDP;
    empty when every parameter is whole (plain averaging over dp-cp)."""
    if isinstance(optimizer, ZeroOptimizer):
        pairs = zip(optimizer.flat_groups, optimizer.masters)
        return [(optimizer.comm, g, m, optimizer.optimizer) for g, m in pairs]
    return [(w.comm, u.group, u.shard, optimizer) for w in parallel.fsdp for u in w.units]


def _gathered(comm, group, shard: torch.Tensor) -> list[torch.Tensor]:
    """Each parameter's part of a flat tensor all-gathered from its shards (collective)."""
    full = torch.empty(group.padded_numel, dtype=shard.dtype, device=shard.device)
    comm.all_gather(full, shard.detach().contiguous())
    return group.views(full)


def _local_state(parallel: ParallelModel, optimizer) -> tuple[dict, dict]:
    """``id(parameter) ->`` its tensor-parallel slice, and its optimizer state
    (``{key: tensor}``), whole on this rank (collective under ZeRO/FSDP)."""
    flat = _flat_parts(parallel, optimizer)
    if not flat:
        state = getattr(optimizer, "state", {})
        params = _trained_parameters(parallel).values()
        return {id(p): p.detach() for p in params}, {id(p): dict(state.get(p, {})) for p in params}
    weights, states = {}, {}
    for comm, group, master, inner in flat:
        for p, view in zip(group.params, _gathered(comm, group, master)):
            weights[id(p)], states[id(p)] = view, {}
        for key, value in inner.state.get(master, {}).items():
            if isinstance(value, torch.Tensor) and value.shape == master.shape:
                views = _gathered(comm, group, value)
            else:
                views = [value] * len(group.params)  # e.g. Adam's step counter
            for p, view in zip(group.params, views):
                states[id(p)][key] = view
    return weights, states


def _optimizer_kind(optimizer) -> str:
    """The update rule's name: the torch class, ``PlainSGD`` counted as ``SGD``."""
    inner = optimizer.optimizer if isinstance(optimizer, ZeroOptimizer) else optimizer
    kind = type(inner).__name__
    return "SGD" if kind == "PlainSGD" else kind


def _dense_parameters(dense: GPT) -> dict[str, nn.Parameter]:
    """The dense model's parameters by name, a tied ``head.weight`` included."""
    return dict(dense.named_parameters(remove_duplicate=False))


def _model_record(dense: GPT) -> dict:
    """What must match between the saved and the loading model."""
    moe = getattr(dense, "moe_config", None)
    return {
        "config": asdict(dense.config),
        "moe": None if moe is None else asdict(moe),
        "shapes": {n: list(p.shape) for n, p in _dense_parameters(dense).items()},
    }


# -------------------------------------------------------------------- save ---


def _everyone(value) -> list:
    """Every rank's ``value``, in rank order (collective)."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, value)
    return every


def _writers(held: list[list[tuple[str, Box]]]) -> dict[tuple[str, Box], int]:
    """Which rank writes each piece: of the ranks holding it, the i-th piece's
    ``i mod holders``-th, so the writing is spread over the replicas."""
    holders: dict[tuple[str, Box], list[int]] = {}
    for rank, pieces in enumerate(held):
        for piece in pieces:
            holders.setdefault(piece, []).append(rank)
    return {
        piece: holders[piece][i % len(holders[piece])] for i, piece in enumerate(sorted(holders))
    }


def _write(path: Path, value) -> None:
    """``torch.save`` to a new file, flushed to disk before the commit names it."""
    with open(path, "wb") as f:
        torch.save(value, f)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(
    path: str | os.PathLike, parallel: ParallelModel, optimizer, dense: GPT, *, step: int,
    loss_scaler=None,
) -> None:  # fmt: skip
    """Write the training state of ``parallel`` and its ``optimizer`` (as built by
    :func:`~distlab.parallel.compose.make_optimizer`) after ``step`` steps to checkpoint
    folder ``path``, keyed by the names of ``dense`` (the plain model ``parallelize`` was
    given; only its names, shapes and config are read), and fp16's ``loss_scaler`` state
    (its scale and good-step count, alike on every rank). Collective: call on every rank.
    The previous checkpoint at ``path`` stays whole until the new one is committed."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    path = Path(path)
    folder = [None]
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        files.remove_uncommitted(path)
        folder = [files.new_data_folder()]
        (path / folder[0]).mkdir()
    dist.broadcast_object_list(folder, src=0)
    data = path / folder[0]
    weights, states = _local_state(parallel, optimizer)
    shapes = {n: p.shape for n, p in _dense_parameters(dense).items()}
    pieces = {}
    for name, p in _trained_parameters(parallel).items():
        dense_name = _dense_name(name, parallel, dense)
        box, real = _box(parallel, dense, dense_name, shapes[dense_name])
        piece_shape = [hi - lo for lo, hi in box]
        state = {
            key: value[real].reshape(piece_shape) if _per_element(value) else value
            for key, value in states[id(p)].items()
        }
        param = weights[id(p)][real].reshape(piece_shape)
        pieces[dense_name, box] = {"param": param.clone(), "state": state}
    writers = _writers(_everyone(sorted(pieces)))
    mine = {_box_key(*k): v for k, v in pieces.items() if writers[k] == rank}
    _write(data / _rank_file(rank), {"pieces": mine, "rng": torch.get_rng_state()})
    if rank == 0:
        index: dict[str, list] = {}
        for (name, box), writer in sorted(writers.items()):
            entry = {"file": _rank_file(writer), "key": _box_key(name, box), "box": box}
            index.setdefault(name, []).append(entry)
        manifest = {
            "format": FORMAT,
            "step": step,
            "layout": asdict(parallel.layout),
            "optimizer": _optimizer_kind(optimizer),
            "model": _model_record(dense),
            "pieces": index,
            "loss_scaler": None if loss_scaler is None else loss_scaler.state_dict(),
        }
        (data / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    dist.barrier()  # every file is written
    names = sorted(p.name for p in data.iterdir())
    mine = files.describe_files(data, files.share(names, rank, world_size))
    described = {name: entry for part in _everyone(mine) for name, entry in part.items()}
    if rank == 0:
        files.write_commit(path, data.name, described, world_size)
    dist.barrier()  # nobody loads before the commit


def check_save_after(save_to, save_after, done: int, steps: int) -> None:
    """``ValueError`` unless ``save_to`` and ``save_after`` come together and step
    ``save_after`` is one of the steps ``done + 1 .. done + steps`` this call runs."""
    if (save_to is None) != (save_after is None):
        raise ValueError(
            f"save_to={save_to!r} and save_after={save_after!r}: give both (a folder and "
            "the step after which to save) or neither"
        )
    if save_after is not None and not done < save_after <= done + steps:
        raise ValueError(
            f"save_after={save_after!r} is not one of the steps this call runs "
            f"({done + 1}..{done + steps}; steps count from the start of training)"
        )


# -------------------------------------------------------------------- load ---


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of checkpoint folder ``path`` (its step, layout, model and pieces),
    without verifying the data; :class:`CheckpointError` if there is no valid one (naming
    the data folder if the commit names one that is missing)."""
    data = files.data_folder(path)
    manifest_path = data / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} has no {MANIFEST}: it is not a checkpoint of a composed run (a data-"
            "parallel save_sharded checkpoint loads with distlab.parallel.checkpoint.data_parallel)"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{manifest_path} is damaged: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{manifest_path} is not a {FORMAT} manifest")
    return manifest


def _check_model(path, manifest: dict, dense: GPT) -> None:
    """``ValueError`` naming the first difference between the saved model and ``dense``."""
    saved, mine = manifest["model"], _model_record(dense)
    for part in ("config", "moe"):
        if saved[part] != mine[part]:
            diff = {
                k: (v, (mine[part] or {}).get(k))
                for k, v in (saved[part] or {}).items()
                if (mine[part] or {}).get(k) != v
            }
            raise ValueError(
                f"checkpoint {path} was written for another model: {part} differs "
                f"(saved value, this model's value): {diff or (saved[part], mine[part])}"
            )
    if saved["shapes"] != mine["shapes"]:
        names = sorted(set(saved["shapes"]) ^ set(mine["shapes"])) or [
            n for n in saved["shapes"] if saved["shapes"][n] != mine["shapes"][n]
        ]
        raise ValueError(f"checkpoint {path} does not match this model's parameters: {names}")


class _Pieces:
    """Reads a checkpoint's pieces and puts each dense tensor together (files read once)."""

    def __init__(self, data: Path, manifest: dict) -> None:
        self.data, self.manifest, self.opened = data, manifest, {}

    def _piece(self, entry: dict) -> dict:
        name = entry["file"]
        if name not in self.opened:
            self.opened[name] = torch.load(self.data / name, weights_only=True, mmap=True)
        return self.opened[name]["pieces"][entry["key"]]

    def rng(self, rank: int) -> torch.Tensor:
        return torch.load(self.data / _rank_file(rank), weights_only=True)["rng"]

    def dense(self, name: str) -> tuple[torch.Tensor, dict]:
        """The whole dense parameter ``name`` and its optimizer state ``{key: tensor}``."""
        shape = self.manifest["model"]["shapes"][name]
        entries = self.manifest["pieces"][name]
        first = self._piece(entries[0])
        param = first["param"].new_empty(shape)
        state = {k: v.new_empty(shape) if _per_element(v) else v for k, v in first["state"].items()}
        covered = 0
        for entry in entries:
            piece, where = self._piece(entry), tuple(slice(lo, hi) for lo, hi in entry["box"])
            param[where] = piece["param"]
            covered += piece["param"].numel()
            for key, value in piece["state"].items():
                if _per_element(value):
                    state[key][where] = value
        if covered != param.numel():
            raise CheckpointError(f"{self.data / MANIFEST}: the pieces of {name} do not cover it")
        return param, state


def _install_flat(parallel: ParallelModel, optimizer, weights: dict, states: dict) -> None:
    """ZeRO/FSDP: this rank's shard of every flat group, and the optimizer state of it."""
    for _, group, master, inner in _flat_parts(parallel, optimizer):
        flat = group.flatten([weights[id(p)] for p in group.params], dtype=master.dtype)
        master.copy_(group.shard_of(flat))
        entry = {}
        for key, value in states[id(group.params[0])].items():
            if _per_element(value):
                per_parameter = [states[id(p)].get(key) for p in group.params]
                entry[key] = group.shard_of(group.flatten(per_parameter, dtype=value.dtype)).clone()
            else:
                entry[key] = _clone(value)  # e.g. Adam's step counter
        if entry:
            inner.state[master] = entry
    if isinstance(optimizer, ZeroOptimizer):
        optimizer.after_load()  # the model's parameters follow the loaded shards


def load_checkpoint(
    path: str | os.PathLike, parallel: ParallelModel, optimizer, dense: GPT, loss_scaler=None
) -> int:
    """Load checkpoint folder ``path`` (written by :func:`save_checkpoint` from any layout)
    into ``parallel`` and its ``optimizer``; return the step it was saved after.
    ``dense``: the plain model ``parallelize`` was given. Collective: call on every rank.
    ``loss_scaler`` (fp16) takes over the saved scaler's state; one saved without a scaler
    (bf16 or fp32) leaves it at its initial scale.

    Every file is verified first; a missing, damaged or foreign checkpoint (or one whose
    data folder is gone) raises :class:`CheckpointError`, another model or optimizer
    ``ValueError``, on every rank. To pick the step to restart from, use
    :func:`~distlab.parallel.checkpoint.data_parallel.latest_verified_checkpoint`."""
    data = verify_sharded(path)
    manifest = read_manifest(path)
    _check_model(path, manifest, dense)
    if manifest["optimizer"] != _optimizer_kind(optimizer):
        raise ValueError(
            f"checkpoint {path} holds the state of a {manifest['optimizer']} optimizer, "
            f"this run's is {_optimizer_kind(optimizer)}"
        )
    pieces = _Pieces(data, manifest)
    weights, states = {}, {}
    for name, p in _trained_parameters(parallel).items():
        dense_name = _dense_name(name, parallel, dense)
        if dense_name not in manifest["pieces"] and dense_name == "head.weight":
            dense_name = "tok.weight"  # tied, saved where one stage held both
        param, state = pieces.dense(dense_name)
        weights[id(p)] = _slice(parallel, dense, dense_name, param)
        states[id(p)] = {
            k: _slice(parallel, dense, dense_name, v) if _per_element(v) else v
            for k, v in state.items()
        }
    with torch.no_grad():
        if _flat_parts(parallel, optimizer):
            _install_flat(parallel, optimizer, weights, states)
        else:
            for p in _trained_parameters(parallel).values():
                p.copy_(weights[id(p)])
                if states[id(p)]:
                    optimizer.state[p] = {k: _clone(v) for k, v in states[id(p)].items()}
    if manifest["layout"] == asdict(parallel.layout):  # the same rank in the same role
        torch.set_rng_state(pieces.rng(dist.get_rank()))
    if loss_scaler is not None and manifest.get("loss_scaler") is not None:
        loss_scaler.load_state_dict(manifest["loss_scaler"])
    return manifest["step"]
