"""Figures for tensor and sequence parallelism.

* :func:`plot_block_collectives`: where each collective sits in a transformer
  block, forward (left to right) and backward (right to left, in the order
  autograd runs it), drawn from the log a
  :class:`~distlab.parallel.tensor.TensorParallelComm` kept while a block ran.
  Tensor parallelism shows Megatron's f and g (Shoeybi et al. 2019, Figure 3);
  sequence parallelism their all-gather/reduce-scatter halves (Korthikanti et
  al. 2022, Figure 5).
* :func:`plot_activation_bytes`: activation bytes per rank against t, with
  and without sequence parallelism, measured points on Table 2's lines
  (computed by :func:`distlab.calc.memory.activation_bytes_per_layer`).

Both return a :class:`matplotlib.figure.Figure` (no pyplot state).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from distlab.calc.memory import activation_bytes_per_layer

#: The forward ops of a GPT block, in order.
STAGES = ("LN1", "q k v", "attention", "proj", "+", "LN2", "fc1", "GeLU", "fc2", "+")
#: The stage boundary (index into STAGES) where a logged collective sits.
BOUNDARY = {"attn in": 1, "attn.proj out": 4, "mlp in": 6, "mlp.fc2 out": 9}
_COLORS = {"all_reduce": "#c44e52", "all_gather": "#4c72b0", "reduce_scatter": "#dd8452"}


def collective_position(phase: str, where: str) -> int:
    """x position of a collective logged at ``where``: the stage boundary in
    forward, mirrored in backward (which runs the stages in reverse)."""
    base = where.removesuffix(" (re-gather)")
    if base not in BOUNDARY:
        raise ValueError(f"no place in a block for a collective at {where!r}; known: {BOUNDARY}")
    return BOUNDARY[base] if phase == "forward" else len(STAGES) - BOUNDARY[base]


def plot_block_collectives(events: Sequence, *, title: str | None = None) -> Figure:
    """One row per pass with the block's stages, a marker per collective in ``events``
    (:class:`~distlab.parallel.tensor.ops.CommEvent`) at the boundary where it ran."""
    fig = Figure(figsize=(9, 2.8), layout="constrained")
    ax = fig.add_subplot()
    rows = {"forward": 1.0, "backward": 0.0}
    for phase, y in rows.items():
        stages = STAGES if phase == "forward" else STAGES[::-1]
        for i, stage in enumerate(stages):
            ax.broken_barh([(i + 0.05, 0.9)], (y - 0.3, 0.6), color="#dddddd")
            ax.text(i + 0.5, y, stage, ha="center", va="center", fontsize=8)
    stacked: Counter = Counter()
    for event in events:
        x = collective_position(event.phase, event.where)
        y = rows[event.phase] + 0.38 + 0.14 * stacked[(event.phase, x)]
        stacked[(event.phase, x)] += 1
        ax.plot([x], [y], "v", color=_COLORS.get(event.collective, "black"), label=event.collective)
        ax.text(x + 0.08, y, event.collective.replace("_", "-"), fontsize=7, va="center")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        ax.legend(unique.values(), unique.keys(), loc="upper right", fontsize=7)
    ax.set_yticks(list(rows.values()), list(rows))
    ax.set_xlim(0, len(STAGES) + 1.2)
    ax.set_ylim(-0.5, 1.9)
    ax.set_xticks([])
    ax.set_title(title or "collectives in one transformer block")
    return fig


def plot_activation_bytes(
    measured: Mapping[tuple[int, bool], float],
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
) -> Figure:
    """Activation bytes per rank vs t. ``measured[(t, sequence_parallel)]`` are
    points (e.g. saved-tensor counts without LayerNorm statistics); the lines
    are Korthikanti et al. 2022, Table 2, for every t that divides ``heads``
    (and ``seq_len`` with SP)."""
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.add_subplot()
    t_max = max([t for t, _ in measured] or [1])
    for sp, color, name in ((False, "#4c72b0", "TP"), (True, "#55a868", "TP + SP")):
        ts = [t for t in range(1, t_max + 1) if heads % t == 0 and (not sp or seq_len % t == 0)]
        formula = [
            activation_bytes_per_layer(
                seq_len=seq_len,
                micro_batch=micro_batch,
                hidden=hidden,
                heads=heads,
                tp=t,
                sequence_parallel=sp,
            )
            / 2**10
            for t in ts
        ]
        ax.plot(ts, formula, "-", color=color, label=f"{name}: Table 2")
        points = sorted((t, b / 2**10) for (t, s), b in measured.items() if s == sp)
        if points:
            ax.scatter(*zip(*points, strict=True), color=color, zorder=3, label=f"{name}: measured")
    ax.set_xlabel("tensor-parallel size t")
    ax.set_ylabel("activation KiB per rank per layer")
    ax.set_title(f"s={seq_len}, b={micro_batch}, h={hidden}, a={heads}")
    ax.legend(fontsize=8)
    return fig
