"""Figures for tensor and sequence parallelism.

* :func:`plot_block_collectives`: where each collective sits in a transformer
  block, forward (left to right) and backward (right to left, in the order
  autograd runs it), drawn from the log a
  :class:`~distlab.parallel.tensor.TensorParallelComm` kept while a block ran.
  Each marker names its operator (:func:`operator_name`): tensor parallelism
  shows Megatron's f and g (Shoeybi et al. 2019, Figure 3), sequence
  parallelism Korthikanti et al.'s g and g-bar, the all-gather/reduce-scatter
  halves of the all-reduce (Korthikanti et al. 2022, Figure 5).
* :func:`plot_activation_bytes`: activation bytes per rank against the
  (integer) tensor-parallel size t, with and without sequence parallelism and,
  if given, with selective recomputation: measured points on Table 2's lines
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
#: Where a block's tensor-parallel region starts (the other BOUNDARY entries end one).
ENTRIES = ("attn in", "mlp in")
_COLORS = {"f": "#4c72b0", "g": "#c44e52", "g-bar": "#dd8452"}
_DRAWN = {"f": "f", "g": "g", "g-bar": r"$\bar{g}$"}


def spelled(collective: str) -> str:
    """A collective's name as figures write it: ``"all_reduce"`` -> ``"all-reduce"``."""
    return collective.replace("_", "-")


def operator_name(where: str, collective: str) -> str:
    """The conjugate operator that issued a collective logged at ``where``.

    With all-reduces (tensor parallelism, Shoeybi et al. 2019, Section 3): ``"f"`` enters a
    tensor-parallel region (identity forward, all-reduce backward), ``"g"`` leaves it
    (all-reduce forward, identity backward). With all-gathers and reduce-scatters (sequence
    parallelism, Korthikanti et al. 2022, Section 4.2.2): ``"g"`` enters (all-gather forward,
    reduce-scatter backward), ``"g-bar"`` leaves (reduce-scatter forward, all-gather backward).
    """
    base = where.removesuffix(" (re-gather)")
    if base not in BOUNDARY:
        raise ValueError(f"no place in a block for a collective at {where!r}; known: {BOUNDARY}")
    entering = base in ENTRIES
    if collective == "all_reduce":
        return "f" if entering else "g"
    if collective in ("all_gather", "reduce_scatter"):
        return "g" if entering else "g-bar"
    raise ValueError(
        f"no operator issues collective {collective!r} in a block; known: all_reduce, "
        "all_gather, reduce_scatter"
    )


def collective_position(phase: str, where: str) -> int:
    """x position of a collective logged at ``where``: the stage boundary in
    forward, mirrored in backward (which runs the stages in reverse)."""
    base = where.removesuffix(" (re-gather)")
    if base not in BOUNDARY:
        raise ValueError(f"no place in a block for a collective at {where!r}; known: {BOUNDARY}")
    return BOUNDARY[base] if phase == "forward" else len(STAGES) - BOUNDARY[base]


def plot_block_collectives(events: Sequence, *, title: str | None = None) -> Figure:
    """One row per pass with the block's stages, a marker per collective in ``events``
    (:class:`~distlab.parallel.tensor.ops.CommEvent`) at the boundary where it ran, labelled
    with its operator (:func:`operator_name`) and its collective, in the legend and beside
    the marker alike (``"f: all-reduce"``; g-bar is drawn as a g with a bar)."""
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
        operator = operator_name(event.where, event.collective)
        label = f"{_DRAWN[operator]}: {spelled(event.collective)}"
        ax.plot([x], [y], "v", color=_COLORS[operator], label=label)
        ax.text(x + 0.08, y, label, fontsize=7, va="center")
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
    selective: Mapping[int, float] | None = None,
) -> Figure:
    """Activation bytes per rank vs the tensor-parallel size t (integer ticks).

    ``measured[(t, sequence_parallel)]`` are points (e.g. saved-tensor counts without
    LayerNorm statistics); ``selective[t]``, if given, are points measured with sequence
    parallelism and selective recomputation. The lines are Korthikanti et al. 2022,
    Table 2, for every t that divides ``heads`` (and ``seq_len`` with SP), one line per
    series drawn."""
    fig = Figure(figsize=(8.5, 3.6), layout="constrained")
    ax = fig.add_subplot()
    t_max = max([t for t, _ in measured] + list(selective or ()) or [1])
    series = [
        ("TP", "#4c72b0", False, "none", {t: b for (t, sp), b in measured.items() if not sp}),
        ("TP + SP", "#55a868", True, "none", {t: b for (t, sp), b in measured.items() if sp}),
    ]
    if selective is not None:
        series.append(("TP + SP + selective recompute", "#8172b2", True, "selective", selective))
    ticks: set[int] = set()
    for name, color, sp, recompute, points in series:
        ts = [t for t in range(1, t_max + 1) if heads % t == 0 and (not sp or seq_len % t == 0)]
        ticks.update(ts)
        formula = [
            activation_bytes_per_layer(
                seq_len=seq_len,
                micro_batch=micro_batch,
                hidden=hidden,
                heads=heads,
                tp=t,
                sequence_parallel=sp,
                recompute=recompute,
            )
            / 2**10
            for t in ts
        ]
        ax.plot(ts, formula, "-", color=color, label=f"{name}: Table 2")
        if points:
            xy = sorted((t, b / 2**10) for t, b in points.items())
            ax.scatter(*zip(*xy, strict=True), color=color, zorder=3, label=f"{name}: measured")
    ax.set_xticks(sorted(ticks))
    ax.set_xlabel("tensor-parallel size t")
    ax.set_ylabel("activation KiB per rank per layer")
    ax.set_title(f"s={seq_len}, b={micro_batch}, h={hidden}, a={heads}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # beside, not on, the lines
    return fig
