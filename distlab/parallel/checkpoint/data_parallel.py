"""Checkpoints for data-parallel training: full (rank 0 writes) or sharded (every rank writes).

What must be saved to continue *bit for bit* as if nothing had happened:
the parameters (at master precision), the optimizer state (Adam's m, v and
step), and every rank's random-number-generator state (dropout masks, data
order). Hyperparameters come from the optimizer the caller builds again.

* **Full** (:func:`save_full` / :func:`load_full`): the state is gathered
  into whole tensors, one per parameter name, and rank 0 writes one file with
  ``torch.save``. Simple and portable (a DDP checkpoint loads into ZeRO or
  FSDP and back, at any world size), but one rank must hold everything.
* **Sharded** (:func:`save_sharded` / :func:`load_sharded`): each rank writes
  only what it owns, with ``torch.distributed.checkpoint`` (DCP). For ZeRO
  and FSDP every flat group is described as a ``DTensor`` of its unpadded
  length split ``Shard(0)`` over the ranks; DCP records which rank wrote
  which range, so a checkpoint written by 4 ranks can be read by 2 (each
  reads the ranges it now owns). Replicated tensors (DDP, buffers) are
  written once. RNG states are per rank and restored only at the same
  world size.

Supported pairs: a plain module or DDP wrapper with a torch optimizer or a
:class:`~distlab.parallel.precision.mixed_precision.MixedPrecisionOptimizer` (its fp32
masters are saved as the weights, with its loss scale); any model with a
:class:`~distlab.parallel.zero.optimizer.ZeroOptimizer`; an
:class:`~distlab.parallel.zero.fsdp.FSDP` model with a torch optimizer or a
``MixedPrecisionOptimizer`` over ``fsdp.parameters()`` (the fp32 masters of
the shards and the loss scale are saved). A sharded owner is anything that
offers :class:`ShardedTraining`. Every function is collective: call it on
all ranks.

Every save is atomic and every load verified
(:mod:`~distlab.parallel.checkpoint.files`): a sharded save writes a new data
folder and publishes it with one rename of ``COMMIT.json``, which records each
file's SHA-256; a full save writes a temporary file and renames it, with a
checksum of its tensors inside. A torn, damaged or foreign checkpoint is
refused with a :class:`CheckpointError` naming the file (or the data folder,
if the commit names one that is gone). To restart, :func:`latest_verified_checkpoint`
finds the newest ``step-N`` whose files verify, warning about each newer step it
skips; :func:`latest_checkpoint` only finds the last committed one.

Only the CPU generator's state is saved. On a GPU, dropout draws from the
CUDA generator (``torch.cuda.get_rng_state``), which is not saved here, so a
GPU run with dropout resumes with other masks: equal in distribution, not
bit for bit.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist
from torch import nn

from distlab.collectives.buffers import Group
from distlab.parallel.checkpoint import files
from distlab.parallel.checkpoint.files import CheckpointError, CheckpointWarning, latest_checkpoint
from distlab.parallel.comm.collectives import Collectives, world
from distlab.parallel.precision.mixed_precision import DynamicLossScaler, MixedPrecisionOptimizer
from distlab.parallel.zero.flat import FlatGroup, named_parameter_index
from distlab.parallel.zero.fsdp import FSDP
from distlab.parallel.zero.optimizer import ZeroOptimizer

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "ShardedTraining",
    "full_state",
    "latest_checkpoint",
    "latest_verified_checkpoint",
    "load_full",
    "load_full_state",
    "load_sharded",
    "read_full",
    "save_full",
    "save_sharded",
    "verify_sharded",
]

# ------------------------------------------------------------ the pieces ----


class ShardedTraining(Protocol):
    """What a wrapper must offer for its flat, sharded state to be checkpointed.

    :class:`~distlab.parallel.zero.optimizer.ZeroOptimizer` and
    :class:`~distlab.parallel.zero.fsdp.FSDP` offer it (and :class:`FSDPMasters`
    for FSDP trained through a ``MixedPrecisionOptimizer``): the
    checkpoint reads and writes each group's ``masters[i]``, this rank's
    shard at master precision, which is what the optimizer updates.
    """

    comm: Collectives  # its all_gather and world_size
    flat_groups: list[FlatGroup]  # the layout: parameters, offsets, shard ranges
    masters: list[torch.Tensor]  # per group, this rank's shard as the optimizer trains it

    def after_load(self) -> None:
        """Make the model's weights follow the just-loaded masters (on every rank)."""


class FSDPMasters:
    """:class:`ShardedTraining` for FSDP of a model cast to 16 bits before wrapping, trained
    through a ``MixedPrecisionOptimizer``: the fp32 masters of its 16-bit shards live in
    the optimizer. (Under a ``MixedPrecisionPolicy`` the shards are fp32 and are the
    masters: FSDP itself is the :class:`ShardedTraining`.)"""

    def __init__(self, fsdp: FSDP, optimizer: MixedPrecisionOptimizer):
        shards = {id(u.shard): i for i, u in enumerate(fsdp.units)}
        if [shards.get(id(p)) for p in optimizer.params] != list(range(len(fsdp.units))):
            raise ValueError(
                "the MixedPrecisionOptimizer of an FSDP model must be built on the FSDP model"
            )
        self.fsdp, self.comm, self.flat_groups = fsdp, fsdp.comm, fsdp.flat_groups
        self.masters = optimizer.masters

    def after_load(self) -> None:
        with torch.no_grad():
            for unit, master in zip(self.fsdp.units, self.masters):
                unit.shard.copy_(master)  # the 16-bit shard is the rounding of its master


class _Parts(NamedTuple):
    """The sharded owner (None when replicated), the torch optimizer, the plain module."""

    owner: ShardedTraining | None
    inner: torch.optim.Optimizer
    module: nn.Module


def _parts(model, optimizer) -> _Parts:
    """Split a (model, optimizer) pair into what the checkpoint functions need."""
    if isinstance(optimizer, ZeroOptimizer):
        return _Parts(optimizer, optimizer.optimizer, optimizer.model)
    if isinstance(model, FSDP):
        if isinstance(optimizer, MixedPrecisionOptimizer) and not optimizer.in_place:
            return _Parts(FSDPMasters(model, optimizer), optimizer.optimizer, model.module)
        if isinstance(optimizer, MixedPrecisionOptimizer):  # the fp32 shards are the masters
            optimizer = optimizer.optimizer
        optimized = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if any(id(m) not in optimized for m in model.masters):
            raise ValueError("the optimizer of an FSDP model must be built on fsdp.parameters()")
        return _Parts(model, optimizer, model.module)
    if isinstance(optimizer, MixedPrecisionOptimizer):
        return _Parts(None, optimizer.optimizer, _module(model))
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "need a torch optimizer, a MixedPrecisionOptimizer or a ZeroOptimizer, "
            f"got {type(optimizer).__name__}"
        )
    return _Parts(None, optimizer, _module(model))


def _weights(optimizer) -> dict[int, torch.Tensor]:
    """id(model parameter) -> the tensor holding its weights at master precision.

    A :class:`MixedPrecisionOptimizer` keeps fp32 masters next to the 16-bit
    model: they are what must be saved (the 16-bit weights are their rounding,
    and resuming from those would lose the low bits). Otherwise: the parameter.
    """
    if isinstance(optimizer, MixedPrecisionOptimizer):
        return {id(p): m for p, m in zip(optimizer.params, optimizer.masters)}
    return {}


def _scaler_state(optimizer) -> torch.Tensor | None:
    """(scale, good steps, skipped steps) of a dynamic loss scaler, or None."""
    scaler = getattr(optimizer, "loss_scaler", None)
    if not isinstance(scaler, DynamicLossScaler):
        return None
    return torch.tensor(
        [scaler.scale, scaler.good_steps, scaler.skipped_steps], dtype=torch.float64
    )


def _load_scaler_state(optimizer, state: torch.Tensor | None) -> None:
    scaler = getattr(optimizer, "loss_scaler", None)
    if isinstance(scaler, DynamicLossScaler) and state is not None:
        scaler.scale = float(state[0])
        scaler.good_steps, scaler.skipped_steps = int(state[1]), int(state[2])


def _module(model) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def _index_of(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """id(param) -> its index in ``optimizer.state_dict()``."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return {id(p): i for i, p in enumerate(params)}


def _per_element(value, master: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and value.shape == master.shape


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    return [
        {k: v for k, v in g.items() if k != "params"}
        for g in optimizer.state_dict()["param_groups"]
    ]


def _load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[int, dict]) -> None:
    optimizer.load_state_dict(
        {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}
    )


def _gather_flat(owner, shard: torch.Tensor) -> torch.Tensor:
    full = torch.empty(
        shard.numel() * owner.comm.world_size, dtype=shard.dtype, device=shard.device
    )
    owner.comm.all_gather(full, shard.detach().contiguous())
    return full


# ------------------------------------------------------------------ full ----


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _replicated_full(parts: _Parts, optimizer) -> tuple[dict, dict]:
    """(weights, optimizer state) by parameter name, of a replicated model."""
    names = named_parameter_index(parts.module)
    index, weights = _index_of(parts.inner), _weights(optimizer)
    saved = parts.inner.state_dict()["state"]
    params, optim = {}, {}
    for p in parts.module.parameters():
        name, w = names[id(p)], weights.get(id(p), p)
        params[name] = w.detach().clone()
        if index.get(id(w)) in saved:
            optim[name] = {k: _clone(v) for k, v in saved[index[id(w)]].items()}
    return params, optim


def _flat_full(parts: _Parts) -> tuple[dict, dict]:
    """(weights, optimizer state) by parameter name, gathered from the shards (collective)."""
    names = named_parameter_index(parts.module)
    params, optim = {}, {}
    for group, master in zip(parts.owner.flat_groups, parts.owner.masters):
        group_names = [names[id(p)] for p in group.params]
        for name, view in zip(group_names, group.views(_gather_flat(parts.owner, master))):
            params[name] = view.clone()
        for key, value in parts.inner.state.get(master, {}).items():
            if _per_element(value, master):
                views = group.views(_gather_flat(parts.owner, value))
            else:
                views = [value] * len(group_names)
            for name, view in zip(group_names, views):
                optim.setdefault(name, {})[key] = _clone(view)
    return params, optim


def full_state(model, optimizer) -> dict:
    """The whole training state as per-name tensors, on every rank (collective)."""
    parts = _parts(model, optimizer)
    if parts.owner is None:
        params, optim = _replicated_full(parts, optimizer)
    else:
        params, optim = _flat_full(parts)
    _, world_size = world()
    rng = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(rng, torch.get_rng_state())
    else:
        rng = [torch.get_rng_state()]
    return {
        "params": params,
        "buffers": {n: b.detach().clone() for n, b in parts.module.named_buffers()},
        "optimizer": optim,
        "hyperparameters": _hyperparameters(parts.inner),
        "rng": rng,
        "world_size": world_size,
        "loss_scaler": _scaler_state(optimizer),
    }


def _load_replicated_full(state: dict, parts: _Parts, optimizer) -> dict[int, dict]:
    """Copy the weights into a replicated model; return its optimizer state by index."""
    names = named_parameter_index(parts.module)
    index, weights = _index_of(parts.inner), _weights(optimizer)
    loaded = {}
    for p in parts.module.parameters():
        name, w = names[id(p)], weights.get(id(p), p)
        w.copy_(state["params"][name])
        if w is not p:
            p.copy_(w)  # the 16-bit model is the rounding of its master
        if name in state["optimizer"] and id(w) in index:
            loaded[index[id(w)]] = state["optimizer"][name]
    return loaded


def _load_flat_full(state: dict, parts: _Parts) -> dict[int, dict]:
    """Copy this rank's shard of every group into its master; return the optimizer state."""
    names = named_parameter_index(parts.module)
    index = _index_of(parts.inner)
    loaded = {}
    for group, master in zip(parts.owner.flat_groups, parts.owner.masters):
        group_names = [names[id(p)] for p in group.params]
        flat = group.flatten([state["params"][n] for n in group_names], dtype=master.dtype)
        master.copy_(group.shard_of(flat))
        first_shape = state["params"][group_names[0]].shape
        entry = {}
        for key, value in state["optimizer"].get(group_names[0], {}).items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape == first_shape:
                per_name = [state["optimizer"][n][key] for n in group_names]
                entry[key] = group.shard_of(group.flatten(per_name, dtype=value.dtype)).clone()
            else:
                entry[key] = value  # e.g. Adam's step counter
        if entry:
            loaded[index[id(master)]] = entry
    return loaded


def load_full_state(state: dict, model, optimizer) -> None:
    """Put a :func:`full_state` into this rank's model and optimizer (any world size)."""
    parts = _parts(model, optimizer)
    with torch.no_grad():
        for name, buffer in parts.module.named_buffers():
            buffer.copy_(state["buffers"][name])
        if parts.owner is None:
            loaded = _load_replicated_full(state, parts, optimizer)
        else:
            loaded = _load_flat_full(state, parts)
    _load_optimizer_state(parts.inner, loaded)
    _load_scaler_state(optimizer, state.get("loss_scaler"))
    for group, hyper in zip(parts.inner.param_groups, state["hyperparameters"]):
        group.update(hyper)
    if parts.owner is not None:
        parts.owner.after_load()
    rank, world_size = world()
    if state["world_size"] == world_size:
        torch.set_rng_state(state["rng"][rank])


def state_checksum(state) -> str:
    """SHA-256 over every tensor and value of a :func:`full_state`, in a fixed order."""
    digest = hashlib.sha256()

    def visit(key: str, value) -> None:
        if isinstance(value, dict):
            for k in sorted(value, key=str):
                visit(f"{key}.{k}", value[k])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(f"{key}[{i}]", v)
        elif isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{key}={value!r}".encode())

    visit("", {k: v for k, v in state.items() if k != "checksum"})
    return digest.hexdigest()


def save_full(path: str | os.PathLike, model, optimizer) -> None:
    """Gather the training state and write it from rank 0 to ``path`` (collective).

    Written to a temporary file and renamed, so ``path`` is always the old or the
    new checkpoint, never half of one; a checksum of the state is stored inside.
    """
    state = full_state(model, optimizer)
    rank, world_size = world()
    if rank == 0:
        state["checksum"] = state_checksum(state)
        temporary = f"{os.fspath(path)}.{os.getpid()}.tmp"
        with open(temporary, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    if world_size > 1:
        dist.barrier()  # nobody reads the file before it is complete


def read_full(path: str | os.PathLike) -> dict:
    """The state in a :func:`save_full` file, verified; :class:`CheckpointError` names the file."""
    try:
        state = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 - a damaged zip or pickle fails in many ways
        raise CheckpointError(f"{path} is damaged: torch.load failed ({exc})") from None
    if not isinstance(state, dict) or "checksum" not in state:
        raise CheckpointError(f"{path} is not a distlab full checkpoint (no checksum inside)")
    if state["checksum"] != state_checksum(state):
        raise CheckpointError(
            f"{path} is damaged: its tensors no longer match the checksum recorded at save"
        )
    return state


def load_full(path: str | os.PathLike, model, optimizer) -> None:
    """Every rank reads and verifies ``path``, and keeps its part (collective)."""
    load_full_state(read_full(path), model, optimizer)


# --------------------------------------------------------------- sharded ----


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    _, world_size = world()
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device, (world_size,))


def _sharded(local: torch.Tensor, global_numel: int, mesh):
    """A DTensor whose local part *is* ``local`` (a view: loading writes into it)."""
    from torch.distributed.tensor import DTensor, Shard

    return DTensor.from_local(
        local,
        mesh,
        [Shard(0)],
        shape=(global_numel, *local.shape[1:]),
        stride=(1,) if local.dim() == 1 else local.stride(),
        run_check=False,
    )


def _owned(group: Group, tensor: torch.Tensor) -> torch.Tensor:
    """The unpadded part of a shard-sized tensor."""
    return tensor.detach()[: group.owned_numel]


def _rng_entry(mesh, local: torch.Tensor):
    """This rank's CPU generator state as row ``rank`` of a (K, n) DTensor.

    ``local`` must already be on the mesh's device (a copy on the GPU under NCCL).
    """
    _, world_size = world()
    return _sharded(local.view(1, -1), world_size, mesh)


def _sharded_layout(model, optimizer, mesh) -> dict:
    """The state dict DCP saves: DTensors for shards, plain tensors for replicated state."""
    owner, inner, module = _parts(model, optimizer)
    names = named_parameter_index(module)
    sd: dict = {f"buffer.{n}": b for n, b in module.named_buffers()}
    if owner is None:
        index = _index_of(inner)
        saved = inner.state_dict()["state"]
        weights = _weights(optimizer)
        for p in module.parameters():
            w = weights.get(id(p), p)
            sd[f"param.{names[id(p)]}"] = w.data
            for key, value in saved.get(index.get(id(w), -1), {}).items():
                sd[f"optim.{names[id(p)]}.{key}"] = value
    else:
        for i, (group, master) in enumerate(zip(owner.flat_groups, owner.masters)):
            sd[f"group{i}.param"] = _sharded(_owned(group, master), group.numel, mesh)
            for key, value in inner.state.get(master, {}).items():
                if _per_element(value, master):
                    sd[f"group{i}.{key}"] = _sharded(_owned(group, value), group.numel, mesh)
                else:
                    sd[f"group{i}.{key}"] = value
    return sd


def save_sharded(path: str | os.PathLike, model, optimizer) -> None:
    """Every rank writes its own part into checkpoint folder ``path`` (collective).

    The parts go to a new ``path/data-<token>/`` with DCP; once every rank has
    finished, rank 0 records each file's SHA-256 in ``path/COMMIT.json`` with one
    atomic rename, then removes the previous data folder
    (:mod:`~distlab.parallel.checkpoint.files`). A save killed half way leaves the
    previous checkpoint at ``path`` whole.
    """
    import torch.distributed.checkpoint as dcp

    rank, world_size = world()
    path = Path(path)
    data = None
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        files.remove_uncommitted(path)
        data = files.new_data_folder()
    data = _agree(data)
    mesh = _mesh()
    sd = _sharded_layout(model, optimizer, mesh)
    sd["rng"] = _rng_entry(mesh, torch.get_rng_state().to(mesh.device_type))
    scaler = _scaler_state(optimizer)
    if scaler is not None:
        sd["loss_scaler"] = scaler
    dcp.save(sd, checkpoint_id=os.fspath(path / data))
    if world_size > 1:
        dist.barrier()  # every file is written (DCP's own metadata included)
    names = sorted(p.name for p in (path / data).iterdir())
    mine = files.describe_files(path / data, files.share(names, rank, world_size))
    described = {name: entry for part in _every_rank(mine) for name, entry in part.items()}
    if rank == 0:
        files.write_commit(path, data, described, world_size)
    if world_size > 1:
        dist.barrier()  # nobody loads before the commit


def _agree(value):
    """Rank 0's ``value`` on every rank."""
    if world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _every_rank(mine) -> list:
    """Every rank's ``mine``, in rank order (collective)."""
    _, world_size = world()
    if world_size == 1:
        return [mine]
    every = [None] * world_size
    dist.all_gather_object(every, mine)
    return every


def verify_sharded(path: str | os.PathLike) -> Path:
    """Check a :func:`save_sharded` folder on every rank; return its data folder (collective).

    Each rank hashes a share of the files; all ranks then raise the same
    :class:`CheckpointError`, naming every file that is missing, truncated,
    damaged or foreign (or the data folder, if the commit names one that is gone).
    """
    rank, world_size = world()
    record = files.read_commit(path)
    data = files.data_folder(path, record)
    mine = files.file_problems(
        data, record["files"], files.share(record["files"], rank, world_size)
    )
    problems = [problem for part in _every_rank(mine) for problem in part]
    if problems:
        raise CheckpointError(f"checkpoint {path} cannot be loaded:\n  " + "\n  ".join(problems))
    return data


def latest_verified_checkpoint(
    folder: str | os.PathLike, prefix: str = "step-"
) -> tuple[int, Path] | None:
    """``(N, folder/prefixN)`` for the highest ``N`` whose checkpoint verifies, or None:
    where a restart should resume from (collective when a process group is up).

    Steps are tried newest first with :func:`verify_sharded` (every file against
    its SHA-256 in the commit, each rank hashing a share), stopping at the first
    that passes. Each newer step passed over (a save that never committed, a
    damaged, truncated or missing file, a missing data folder) is reported as a
    :class:`CheckpointWarning` that names the step and carries the
    :class:`CheckpointError` message (on rank 0 only, so it is printed once). Works
    for :func:`save_sharded` and :func:`~distlab.parallel.compose.save_checkpoint`
    folders alike.

    Cost: it reads every file of the step it returns (and of each damaged one
    before it), at the SHA-256 rate ``benchmarks/checkpoint_checksum.py`` prints
    (about 1 GB/s per core), and the load then verifies that step once more.
    :func:`latest_checkpoint` reads only the commits, and loading what it
    returns fails on a damaged step instead of falling back.
    """
    rank, _ = world()
    steps = _agree(files.step_folders(folder, prefix) if rank == 0 else None)
    for step, path in steps:
        try:
            verify_sharded(path)
        except CheckpointError as refused:
            if rank == 0:
                warnings.warn(
                    f"restart: skipping step {step}: {refused}", CheckpointWarning, stacklevel=2
                )
            continue
        return step, path
    return None


def _fresh(meta, device, numel: int | None = None) -> torch.Tensor:
    """A zero tensor to load a stored entry into (``numel``: a shard's length instead)."""
    shape = (numel,) if numel is not None else tuple(meta.size)
    return torch.zeros(shape, dtype=meta.properties.dtype, device=device)


def _replicated_targets(parts: _Parts, optimizer, stored: dict, sd: dict) -> dict[int, dict]:
    """Point ``sd`` at the weights of a replicated model; return the optimizer state to fill."""
    names = named_parameter_index(parts.module)
    index, weights = _index_of(parts.inner), _weights(optimizer)
    states: dict[int, dict] = {}
    for p in parts.module.parameters():
        name, w = names[id(p)], weights.get(id(p), p)
        sd[f"param.{name}"] = w.data
        for key, meta in stored.items():
            if key.startswith(f"optim.{name}."):
                value = sd[key] = _fresh(meta, p.device if meta.size else "cpu")
                states.setdefault(index[id(w)], {})[key.rsplit(".", 1)[1]] = value
    return states


def _flat_targets(parts: _Parts, stored: dict, sd: dict, mesh) -> dict[int, dict]:
    """Point ``sd`` at this rank's shards (as DTensors); return the optimizer state to fill."""
    index = _index_of(parts.inner)
    states: dict[int, dict] = {}
    for i, (group, master) in enumerate(zip(parts.owner.flat_groups, parts.owner.masters)):
        size = tuple(stored[f"group{i}.param"].size)
        if size != (group.numel,):
            raise ValueError(
                f"checkpoint group {i} has {size} elements, this model's has {group.numel}: "
                "different model or grouping"
            )
        sd[f"group{i}.param"] = _sharded(_owned(group, master), group.numel, mesh)
        for key, meta in stored.items():
            if key.startswith(f"group{i}.") and key != f"group{i}.param":
                if tuple(meta.size) == (group.numel,):
                    value = _fresh(meta, master.device, group.shard_numel)
                    sd[key] = _sharded(_owned(group, value), group.numel, mesh)
                else:
                    value = sd[key] = _fresh(meta, "cpu")  # e.g. Adam's step counter
                states.setdefault(index[id(master)], {})[key.split(".", 1)[1]] = value
    return states


def load_sharded(path: str | os.PathLike, model, optimizer) -> None:
    """Read a :func:`save_sharded` checkpoint, at this or another world size (collective).

    The files are verified first (:func:`verify_sharded`); an incomplete or
    damaged checkpoint raises :class:`CheckpointError` on every rank.
    """
    import torch.distributed.checkpoint as dcp

    path = os.fspath(verify_sharded(path))
    stored = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    parts = _parts(model, optimizer)
    mesh = _mesh()
    sd: dict = {f"buffer.{n}": b for n, b in parts.module.named_buffers()}
    if parts.owner is None:
        states = _replicated_targets(parts, optimizer, stored, sd)
    else:
        states = _flat_targets(parts, stored, sd, mesh)
    rng = None
    if "rng" in stored and stored["rng"].size[0] == world()[1]:
        rng = torch.get_rng_state().to(mesh.device_type, copy=True)
        sd["rng"] = _rng_entry(mesh, rng)
    scaler = _scaler_state(optimizer)
    if scaler is not None and "loss_scaler" in stored:
        sd["loss_scaler"] = scaler
    with torch.no_grad():
        dcp.load(sd, checkpoint_id=path)
    _finish_load(parts, optimizer, states, scaler)
    if rng is not None:
        torch.set_rng_state(rng.cpu())


def _finish_load(parts: _Parts, optimizer, states: dict[int, dict], scaler) -> None:
    """After the tensors are read: round masters into the model, restore optimizer and scaler."""
    with torch.no_grad():
        weights = _weights(optimizer)
        for p in parts.module.parameters():
            w = weights.get(id(p), p)
            if w is not p:
                p.copy_(w)  # the 16-bit model is the rounding of its master
    _load_optimizer_state(parts.inner, states)
    _load_scaler_state(optimizer, scaler)
    if parts.owner is not None:
        parts.owner.after_load()
