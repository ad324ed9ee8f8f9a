"""Figures for mixture-of-experts routing: how evenly the experts are loaded.

:func:`plot_expert_load` draws the per-expert load (fraction of the batch's
assignments, :func:`distlab.parallel.moe.layer.expert_load`) over a short training
run, once without and once with the load-balancing loss (Switch Transformer,
Fedus et al. 2021, eq. 4), on a shared y axis. The dashed line is the
uniform load ``1 / E``: with the loss the lines gather around it, without
it the router tends to send everything to the experts it already prefers.

Returns a :class:`matplotlib.figure.Figure` (no pyplot state).
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from distlab.viz.style import NOTEBOOK_WIDTH_IN


def plot_expert_load(
    runs: dict[str, torch.Tensor], *, title: str = "Tokens per expert during training"
) -> Figure:
    """One panel per run: ``runs`` maps a label to a ``(steps, experts)`` load tensor."""
    if not runs:
        raise ValueError("runs must name at least one (steps, experts) load tensor")
    for label, loads in runs.items():
        if not isinstance(loads, torch.Tensor) or loads.ndim != 2:
            raise ValueError(f"run {label!r}: expected a (steps, experts) tensor, got {loads!r}")
    fig = Figure(figsize=(min(NOTEBOOK_WIDTH_IN, 4.2 * len(runs)), 3.2), layout="constrained")
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (label, loads) in zip(axes, runs.items()):
        steps = range(1, loads.shape[0] + 1)
        for expert in range(loads.shape[1]):
            ax.plot(steps, loads[:, expert].tolist(), label=f"expert {expert}")
        ax.axhline(1 / loads.shape[1], color="black", linestyle="--", linewidth=1, label="uniform")
        ax.set_title(label)
        ax.set_xlabel("training step")
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("fraction of tokens")
    axes[-1].legend(loc="upper right", fontsize="small")
    fig.suptitle(title)
    return fig
