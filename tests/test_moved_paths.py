"""Module paths from before ``distlab.parallel`` had families still import (older notebooks).

A notebook from an older release imports ``distlab.parallel.fsdp``, ``.training``,
``.buckets``...; a learner's copy must keep running against today's library.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import distlab.parallel
from distlab.parallel.moved import MOVED, new_name

#: public names of the old modules whose path is now a family's folder (as of the last
#: release before the families); the family's ``__init__`` must still hand each on
OLD_FAMILY_MODULES = {
    "comm": [
        "ALGORITHMS", "world", "Collectives", "broadcast_module_state",
        "broadcast_module_buffers", "CommThread", "now",
    ],
    "data": ["shard_indices", "ShardSampler", "shard_batch"],
    "zero": ["ZeroOptimizer"],
    "context": [
        "local_positions", "split_sequence", "ContextGroup", "Ring", "RingPass",
        "ring_attention", "causal_attention_at", "dense_causal_attention",
        "ContextParallelBlock",
    ],
    "moe": [
        "ALL_TO_ALL_ALGORITHMS", "Routing", "route", "Expert", "Router", "MoE",
        "ExpertParallelMoE", "exchange_blocks", "AllToAll", "expert_load",
        "average_moe_gradients", "load_balance_run",
    ],
    "checkpoint": [
        "ShardedTraining", "FSDPMasters", "full_state", "load_full_state", "state_checksum",
        "save_full", "read_full", "load_full", "save_sharded", "verify_sharded",
        "latest_verified_checkpoint", "load_sharded",
    ],
}  # fmt: skip


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_with_a_warning_and_the_same_objects(old):
    name = f"distlab.parallel.{old}"
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=rf"{name} is now {new_name(name)}"):
        module = importlib.import_module(name)
    new = importlib.import_module(new_name(name))
    public = [n for n in vars(new) if not n.startswith("_")]
    assert public
    for attribute in public:
        assert getattr(module, attribute) is getattr(new, attribute), attribute


def test_no_old_path_shadows_a_module_of_today():
    for old, new in MOVED.items():
        assert importlib.util.find_spec(f"distlab.parallel.{new}") is not None, new
        folder = distlab.parallel.__path__[0]
        assert not (importlib.util.find_spec(f"distlab.parallel.{old}").origin or "").startswith(
            folder + f"/{old}"
        ), f"distlab/parallel/{old} exists again: drop it from MOVED"


def test_from_import_of_an_old_module_name_works():
    """``from distlab.parallel import training`` (notebooks 04-06, 10, 11 of older releases)."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    from distlab.parallel import training\n"
        "except DeprecationWarning as w:\n"
        "    print(w)\n"
        "else:\n"
        "    raise SystemExit('no warning')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "distlab.parallel.data.training" in out.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from distlab.parallel import training
    assert training.build is importlib.import_module("distlab.parallel.data.training").build


@pytest.mark.parametrize("family", sorted(OLD_FAMILY_MODULES))
def test_a_family_hands_on_the_names_of_the_module_it_replaced(family):
    package = importlib.import_module(f"distlab.parallel.{family}")
    missing = [n for n in OLD_FAMILY_MODULES[family] if not hasattr(package, n)]
    assert not missing, f"distlab.parallel.{family} lost {missing}"
