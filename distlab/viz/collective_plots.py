"""Pictures of collectives, drawn from the same schedules the code executes.

Each rank is a row, each chunk of its buffer a box (column c is chunk c). A
box is coloured by the ranks whose data it holds: one colour for one rank's
data, stripes for a sum (a reduction mixes several ranks' data), hatched for
"nothing yet". The label names the contents, ranks lettered a, b, c, ...:
``b`` is rank 1's data, ``acd`` the sum of ranks 0, 2 and 3, ``Σ`` the sum
over every rank; in an all-to-all ``b2`` is rank 1's block 2. Faded boxes
hold leftovers the collective does not promise (a reduce-scatter leaves
partial sums in the chunks a rank does not own). In a step, each message is an
arrow in the gap right of its chunk's column, from a dot on the sender's row to
the receiver's row; arrows whose rows overlap run in separate lanes, so they do
not cross.

* :func:`plot_collective` - start and end state of one collective;
* :func:`plot_all_collectives` - the six of them, one row each;
* :func:`plot_steps` - every step of a schedule as small multiples (the static
  fallback of the player), as many per row as a notebook's width holds;
* :func:`plot_step` - one step, the player's frame;
* :func:`schedule_player` / :func:`ring_all_reduce_player` - an ipywidgets
  slider that steps through a schedule; where no widget frontend exists
  (nbviewer, GitHub, a terminal) the same object shows the static figure.

States come from :func:`distlab.core.collective_schedule.trace`, which plays a
schedule symbolically, so the picture is the algorithm, not a drawing of it.
"""

from __future__ import annotations

import base64
import io
import string
from collections import Counter
from collections.abc import Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distlab.core.checks import int_in
from distlab.core.collective_schedule import CollectiveSchedule, trace
from distlab.sim import algorithms as registry
from distlab.viz.style import NOTEBOOK_WIDTH_IN

#: The collective each picture uses, and the schedule that produces its end state: the
#: registry's first algorithm for it (ring, tree for broadcast and reduce, pairwise all-to-all).
COLLECTIVES = {
    c: registry.lookup(registry.algorithms_for(c)[0], c).builder for c in registry.collectives()
}

TITLES = {
    "all_reduce": "all-reduce: everyone gets the sum",
    "reduce_scatter": "reduce-scatter: rank r gets chunk r of the sum",
    "all_gather": "all-gather: everyone gets every rank's chunk",
    "broadcast": "broadcast: everyone gets the root's tensor",
    "reduce": "reduce: the root gets the sum",
    "all_to_all": "all-to-all: rank r gets block r of every rank",
}

MAX_WORLD_SIZE = 8
BOX = 0.64  # box width; the gap to the next column holds the arrows
UNIT_IN = 0.44  # inches per box height in the step pictures: a label fits in its box
LABELS_LEFT = -1.1  # x where a panel with rank labels starts (they end at -0.15)
BARE_LEFT = -0.12  # x where a panel without them starts
_COLORS = matplotlib.colormaps["tab10"].colors
Grid = list[list[Counter]]


def _subplots(rows: int, columns: int, figsize: tuple[float, float], **kwargs):
    """A :class:`Figure` made without pyplot (the idiom of every ``distlab.viz`` module): it
    shows once, as the value of a notebook cell or via ``display``."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, columns, squeeze=False, **kwargs)


def _check_world_size(world_size: int) -> None:
    int_in("world_size", world_size, 1, MAX_WORLD_SIZE)


def schedule_for(collective: str, world_size: int = 4, root: int = 0) -> CollectiveSchedule:
    """The schedule drawn for ``collective`` (one of :data:`COLLECTIVES`)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; allowed: {sorted(COLLECTIVES)}")
    _check_world_size(world_size)
    if collective in ("broadcast", "reduce"):
        if not 0 <= root < world_size:
            raise ValueError(f"root must be a rank in 0..{world_size - 1}, got {root!r}")
        return COLLECTIVES[collective](world_size, root)
    return COLLECTIVES[collective](world_size)


def start_state(schedule: CollectiveSchedule) -> Grid:
    """What each rank holds before the collective (its input buffer)."""
    if schedule.out_of_place:  # all-to-all: rank r's input block c is (r, c)
        n, k = schedule.world_size, schedule.n_chunks
        return [[Counter([(r, c)]) for c in range(k)] for r in range(n)]
    return trace(schedule)[0]


def promised(schedule: CollectiveSchedule, rank: int, chunk: int) -> bool:
    """Whether the collective defines the content of ``chunk`` on ``rank`` at the end."""
    if schedule.collective == "reduce_scatter":
        return chunk == rank
    if schedule.collective == "reduce":
        return rank == schedule.root
    return True


# ---------------------------------------------------------------- labels ---
def rank_letter(rank: int) -> str:
    return string.ascii_lowercase[rank]


def box_label(contents: Counter, world_size: int) -> str:
    """``b`` (rank 1's data), ``ac`` (ranks 0 and 2 summed), ``Σ`` (every rank summed),
    ``b2`` (all-to-all: rank 1's block 2), ``""`` (empty). A value added twice shows ``2×``."""
    if not contents:
        return ""
    keys = sorted(contents)
    if isinstance(keys[0], tuple):  # all-to-all: (source rank, block)
        return ",".join(f"{rank_letter(r)}{b}" for r, b in keys)
    repeated = any(count > 1 for count in contents.values())
    if len(keys) == world_size > 1 and not repeated:
        return "Σ"
    return "".join(f"{contents[k]}×" * (contents[k] > 1) + rank_letter(k) for k in keys)


def _sources(contents: Counter) -> list[int]:
    return sorted({k[0] if isinstance(k, tuple) else k for k in contents})


# --------------------------------------------------------------- drawing ---
def draw_state(
    ax,
    state: Grid,
    schedule: CollectiveSchedule,
    title: str = "",
    end: bool = False,
    chunk_labels: bool = True,
    rank_labels: bool = True,
) -> None:
    """Draw ``state`` (rank rows x chunk columns) on ``ax``; ``rank_labels=False`` leaves
    out the ``rank r`` names on the left (a panel beside one that has them)."""
    n, k = len(state), len(state[0])
    for r in range(n):
        for c in range(k):
            contents = state[r][c]
            faded = end and not promised(schedule, r, c)
            _draw_box(ax, c, r, contents, faded)
            label = box_label(contents, n)
            if label:
                ax.text(
                    c + BOX / 2,
                    r + 0.5,
                    label,
                    ha="center",
                    va="center",
                    fontsize={1: 9, 2: 9, 3: 8}.get(len(label), 7),
                    color="0.45" if faded else "black",
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
                )
        if rank_labels:
            ax.text(-0.15, r + 0.5, f"rank {r}", ha="right", va="center", fontsize=9)
    if chunk_labels and k > 1:
        for c in range(k):  # the column's number under it, "chunk" once on the left
            ax.text(c + BOX / 2, n + 0.1, str(c), ha="center", va="top", fontsize=8, color="0.4")
        if rank_labels:
            ax.text(-0.15, n + 0.1, "chunk", ha="right", va="top", fontsize=8, color="0.4")
    ax.set_xlim(LABELS_LEFT if rank_labels else BARE_LEFT, k)
    ax.set_ylim(n + 0.5, -0.05)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9)


def _draw_box(ax, x: float, y: float, contents: Counter, faded: bool) -> None:
    sources = _sources(contents)
    alpha = 0.25 if faded else 0.85
    if not sources:
        ax.add_patch(
            Rectangle((x, y), BOX, 1, facecolor="white", edgecolor="0.6", hatch="//", lw=0.8)
        )
        return
    width = BOX / len(sources)
    for i, r in enumerate(sources):  # one stripe per contributing rank
        ax.add_patch(
            Rectangle((x + i * width, y), width, 1, facecolor=_COLORS[r % 10], alpha=alpha, lw=0)
        )
    ax.add_patch(Rectangle((x, y), BOX, 1, fill=False, edgecolor="0.3", lw=0.8))


def _lanes(spans: list[tuple[float, float]]) -> list[int]:
    """A lane for each vertical span (low, high), the lowest free one, so that spans which
    overlap or touch never share a lane (interval colouring, widest first)."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0] - spans[i][1], spans[i]))
    lane = [0] * len(spans)
    for placed, i in enumerate(order):
        taken = {
            lane[j]
            for j in order[:placed]
            if spans[j][0] <= spans[i][1] and spans[i][0] <= spans[j][1]
        }
        lane[i] = min(set(range(len(spans) + 1)) - taken)
    return lane


def draw_transfers(ax, schedule: CollectiveSchedule, step: int) -> None:
    """Arrows for the messages of ``schedule.steps[step]``: in the gap right of the chunk's
    column, from a dot on the sender's row to an arrowhead on the receiver's; arrows in one
    gap whose rows overlap get separate lanes, so they run side by side instead of crossing."""
    moves = [
        (t, c_from, c_to)
        for t in schedule.steps[step]
        if t.src != t.dst
        for c_from, c_to in zip(t.chunks, t.landing)
    ]
    by_gap: dict[int, list[int]] = {}  # a message landing in another chunk: a gap of its own
    for i, (_, c_from, c_to) in enumerate(moves):
        by_gap.setdefault(c_from if c_from == c_to else -1 - i, []).append(i)
    x_of = {}
    for members in by_gap.values():
        spans = [tuple(sorted((moves[i][0].src, moves[i][0].dst))) for i in members]
        lanes = _lanes(spans)
        count = max(lanes) + 1
        for i, lane in zip(members, lanes):
            x_of[i] = BOX + (1 - BOX) * (lane + 1) / (count + 1)
    for i, (t, c_from, c_to) in enumerate(moves):
        color = "crimson" if t.reduce else "navy"
        start = (c_from + x_of[i], t.src + 0.5)
        end = (c_to + x_of[i], t.dst + 0.5)
        ax.add_patch(
            FancyArrowPatch(
                start,
                end,
                arrowstyle="-|>",
                mutation_scale=8,
                shrinkA=0,
                shrinkB=0,
                color=color,
                lw=1.2,
            )
        )
        ax.plot(*start, "o", color=color, markersize=3)


def plot_collective(collective: str, world_size: int = 4, root: int = 0) -> Figure:
    """Start and end state of one collective, side by side."""
    schedule = schedule_for(collective, world_size, root)
    states = trace(schedule)
    fig, axes = _subplots(1, 2, figsize=(2.2 + 1.5 * schedule.n_chunks, 0.4 + 0.7 * world_size))
    before, after = axes[0]
    draw_state(before, start_state(schedule), schedule, "before")
    draw_state(after, states[-1], schedule, "after", end=True)
    fig.suptitle(TITLES[collective], fontsize=11)
    fig.tight_layout()
    return fig


def plot_all_collectives(world_size: int = 4) -> Figure:
    """The six collectives, one row each: before | after."""
    _check_world_size(world_size)
    names = list(COLLECTIVES)
    fig, axes = _subplots(len(names), 2, figsize=(9, 1.1 * world_size * len(names) / 2 + 1))
    for row, name in zip(axes, names):
        schedule = schedule_for(name, world_size)
        draw_state(row[0], start_state(schedule), schedule, f"{TITLES[name]}\nbefore")
        draw_state(row[1], trace(schedule)[-1], schedule, "after", end=True)
    fig.tight_layout()
    return fig


def _step_title(schedule: CollectiveSchedule, step: int) -> str:
    if step == 0:
        return "start"
    phase = ""
    if schedule.algorithm == "ring" and schedule.collective == "all_reduce":
        half = schedule.n_steps // 2
        phase = "\n(reduce-scatter)" if step <= half else "\n(all-gather)"
    return f"after step {step}{phase}"


def draw_step(
    ax, schedule: CollectiveSchedule, states: Sequence[Grid], step: int, rank_labels: bool = True
) -> None:
    """State after ``step`` steps, with the arrows of the messages that produced it."""
    draw_state(
        ax,
        states[step],
        schedule,
        _step_title(schedule, step),
        end=step == schedule.n_steps,
        rank_labels=rank_labels,
    )
    if step > 0:
        draw_transfers(ax, schedule, step - 1)


def _panel_width(n_chunks: int, rank_labels: bool) -> float:
    """Inches one step panel takes at :data:`UNIT_IN` per box, at least its title's width."""
    labels = (BARE_LEFT - LABELS_LEFT) * UNIT_IN if rank_labels else 0.0
    return labels + max(1.0, (n_chunks - BARE_LEFT) * UNIT_IN)


def _panel_height(world_size: int) -> float:
    return (world_size + 0.55) * UNIT_IN + 0.45  # the rows, the chunk numbers, a title


_LEGEND = "red: sent and added, blue: sent and copied (dot: sender)"


def plot_steps(schedule: CollectiveSchedule, columns: int = 4) -> Figure:
    """Every state of ``schedule``, start to end, as a grid of small panels: at most
    ``columns`` per row, fewer if that many would be wider than a notebook shows
    (:data:`~distlab.viz.style.NOTEBOOK_WIDTH_IN`). Only the first panel of each row names
    the ranks."""
    states = trace(schedule)
    panels = schedule.n_steps + 1
    n, k = schedule.world_size, schedule.n_chunks
    first, other = _panel_width(k, True), _panel_width(k, False)
    columns = max(1, min(columns, panels, 1 + int((NOTEBOOK_WIDTH_IN - 0.2 - first) // other)))
    rows = -(-panels // columns)
    widths = [first] + [other] * (columns - 1)
    fig, axes = _subplots(
        rows,
        columns,
        figsize=(sum(widths) + 0.2, rows * _panel_height(n) + 0.5),
        gridspec_kw={"width_ratios": widths},
    )
    for i, ax in enumerate(axes.flat):
        if i < panels:
            draw_step(ax, schedule, states, i, rank_labels=i % columns == 0)
        else:
            ax.axis("off")
    fig.suptitle(
        f"{schedule.algorithm} {schedule.collective.replace('_', '-')} on {n} ranks; {_LEGEND}",
        fontsize=10,
    )
    fig.set_layout_engine("constrained", w_pad=0.02, wspace=0.02)
    return fig


def plot_step(schedule: CollectiveSchedule, step: int) -> Figure:
    """One panel: the state after ``step`` steps and the messages of that step (the
    player's frame)."""
    step = int_in("step", step, 0, schedule.n_steps)
    n, k = schedule.world_size, schedule.n_chunks
    fig, axes = _subplots(1, 1, figsize=(_panel_width(k, True) + 0.3, _panel_height(n) + 0.4))
    draw_step(axes[0, 0], schedule, trace(schedule), step)
    fig.suptitle(_LEGEND, fontsize=8)
    fig.set_layout_engine("constrained")
    return fig


# ---------------------------------------------------------------- player ---
def _figure_png(fig: Figure) -> str:
    """The figure as base64 PNG, the form notebooks store images in."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def schedule_player(schedule: CollectiveSchedule, static: bool | None = None):
    """A slider that steps through ``schedule``; or, with ``static=True`` or without
    ipywidgets, the :func:`plot_steps` figure.

    The widget also carries a PNG of :func:`plot_steps` in its display data, so a
    frontend that cannot render widgets (nbviewer, GitHub, nbconvert to HTML
    without widget state) shows the static picture instead of a bare
    ``VBox(...)`` line.
    """
    if static is None:
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            static = True
    if static:
        return plot_steps(schedule)
    return _Player(schedule)


def ring_all_reduce_player(world_size: int = 4, static: bool | None = None):
    """Step through a ring all-reduce: n-1 reduce-scatter steps, then n-1 all-gather steps."""
    _check_world_size(world_size)
    return schedule_player(COLLECTIVES["all_reduce"](world_size), static)


def _player_class():
    import ipywidgets as widgets

    class Player(widgets.VBox):
        """ipywidgets player: a Play button and a slider driving a matplotlib figure."""

        def __init__(self, schedule: CollectiveSchedule):
            self.schedule = schedule
            self.slider = widgets.IntSlider(
                value=0, min=0, max=schedule.n_steps, description="step", continuous_update=False
            )
            play = widgets.Play(
                value=0, min=0, max=schedule.n_steps, interval=1200, description="play"
            )
            widgets.jslink((play, "value"), (self.slider, "value"))
            self.output = widgets.Output()
            super().__init__([widgets.HBox([play, self.slider]), self.output])
            self.slider.observe(lambda change: self.show(change["new"]), names="value")
            self.show(0)

        def show(self, step: int) -> None:
            """Redraw the figure for ``step`` (also what the slider calls)."""
            from IPython.display import display

            fig = plot_step(self.schedule, step)
            self.current_step = step
            with self.output:
                self.output.clear_output(wait=True)
                display(fig)

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs) or {}
            fig = plot_steps(self.schedule)
            bundle["image/png"] = _figure_png(fig)
            return bundle

    return Player


def _Player(schedule: CollectiveSchedule):  # builds the widget class on first use
    return _player_class()(schedule)
