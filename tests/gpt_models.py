"""The model a composed-training test starts from: the dense GPT, or the same GPT with MoE blocks.

Shared by test_compose.py (and the tests that reuse its layouts), test_compose_checkpoint.py
and test_calc_run_activations.py. Imported by name (``from gpt_models import make_model``:
pytest puts this folder on ``sys.path``, and the launcher gives each worker the parent's).
"""

from __future__ import annotations

from distlab.models import GPT, GPTConfig


def make_model(
    config: GPTConfig, moe: dict | None = None, *, seed: int = 0, routing_groups: int = 1
) -> GPT:
    """``GPT(config, seed=seed)`` when ``moe`` is None, else ``MoEGPT`` with
    ``MoEConfig(num_experts=4, **moe)`` (``moe`` may name another ``num_experts``) and
    ``routing_groups`` (a single-process reference routes its batch in the groups the
    parallel run routes apart)."""
    if moe is None:
        return GPT(config, seed=seed)
    from distlab.parallel.moe.gpt import MoEConfig, MoEGPT

    settings = MoEConfig(**{"num_experts": 4, **moe})
    return MoEGPT(config, settings, seed=seed, routing_groups=routing_groups)
