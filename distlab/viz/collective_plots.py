"""Pictures of collectives, drawn from the same schedules the code executes.

Each rank is a row, each chunk of its buffer a box (column c is chunk c). A
box is coloured by the ranks whose data it holds: one colour for one rank's
data, stripes for a sum (a reduction mixes several ranks' data), hatched for
"nothing yet". The label names the contents, ranks lettered a, b, c, ...:
``b`` is rank 1's data, ``acd`` the sum of ranks 0, 2 and 3, ``Σ`` the sum
over every rank; in an all-to-all ``b2`` is rank 1's block 2. Faded boxes
hold leftovers the collective does not promise (a reduce-scatter leaves
partial sums in the chunks a rank does not own).

* :func:`plot_collective` - start and end state of one collective;
* :func:`plot_all_collectives` - the six of them, one row each;
* :func:`plot_steps` - every step of a schedule as small multiples (the static
  fallback of the player);
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
from distlab.core.collective_schedule import Schedule, trace
from distlab.sim import algorithms as registry

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
BOX = 0.72  # box width; the gap to the next column holds the arrows
_COLORS = matplotlib.colormaps["tab10"].colors
Grid = list[list[Counter]]


def _subplots(rows: int, columns: int, figsize: tuple[float, float]):
    """A :class:`Figure` made without pyplot (the idiom of every ``distlab.viz`` module): it
    shows once, as the value of a notebook cell or via ``display``."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, columns, squeeze=False)


def _check_world_size(world_size: int) -> None:
    int_in("world_size", world_size, 1, MAX_WORLD_SIZE)


def schedule_for(collective: str, world_size: int = 4, root: int = 0) -> Schedule:
    """The schedule drawn for ``collective`` (one of :data:`COLLECTIVES`)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; allowed: {sorted(COLLECTIVES)}")
    _check_world_size(world_size)
    if collective in ("broadcast", "reduce"):
        if not 0 <= root < world_size:
            raise ValueError(f"root must be a rank in 0..{world_size - 1}, got {root!r}")
        return COLLECTIVES[collective](world_size, root)
    return COLLECTIVES[collective](world_size)


def start_state(schedule: Schedule) -> Grid:
    """What each rank holds before the collective (its input buffer)."""
    if schedule.out_of_place:  # all-to-all: rank r's input block c is (r, c)
        n, k = schedule.world_size, schedule.n_chunks
        return [[Counter([(r, c)]) for c in range(k)] for r in range(n)]
    return trace(schedule)[0]


def promised(schedule: Schedule, rank: int, chunk: int) -> bool:
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
    schedule: Schedule,
    title: str = "",
    end: bool = False,
    chunk_labels: bool = True,
) -> None:
    """Draw ``state`` (rank rows x chunk columns) on ``ax``."""
    n, k = len(state), len(state[0])
    for r in range(n):
        for c in range(k):
            contents = state[r][c]
            faded = end and not promised(schedule, r, c)
            _draw_box(ax, c, r, contents, faded)
            label = box_label(contents, n)
            if label:
                size = 9 if len(label) <= 3 else 7
                ax.text(
                    c + BOX / 2,
                    r + 0.5,
                    label,
                    ha="center",
                    va="center",
                    fontsize=size,
                    color="0.45" if faded else "black",
                )
        ax.text(-0.15, r + 0.5, f"rank {r}", ha="right", va="center", fontsize=9)
    if chunk_labels and k > 1:
        for c in range(k):
            ax.text(
                c + BOX / 2, n + 0.12, f"chunk {c}", ha="center", va="top", fontsize=7, color="0.4"
            )
    ax.set_xlim(-1.1, k + 0.1)
    ax.set_ylim(n + 0.45, -0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)


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


def draw_transfers(ax, schedule: Schedule, step: int) -> None:
    """Arrows for the messages of ``schedule.steps[step]``: from (src, chunk) to (dst, landing chunk)."""
    for t in schedule.steps[step]:
        if t.src == t.dst:
            continue
        for c_from, c_to in zip(t.chunks, t.landing):
            arrow = FancyArrowPatch(  # drawn in the gap right of the chunk's column
                (c_from + BOX + 0.02, t.src + 0.5),
                (c_to + BOX + 0.02, t.dst + 0.5),
                connectionstyle="arc3,rad=-0.3",
                arrowstyle="-|>",
                mutation_scale=11,
                color="crimson" if t.reduce else "navy",
                lw=1.6,
                alpha=0.85,
            )
            ax.add_patch(arrow)


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


def _step_title(schedule: Schedule, step: int) -> str:
    if step == 0:
        return "start"
    phase = ""
    if schedule.algorithm == "ring" and schedule.collective == "all_reduce":
        half = schedule.n_steps // 2
        phase = " (reduce-scatter)" if step <= half else " (all-gather)"
    return f"after step {step}{phase}"


def draw_step(ax, schedule: Schedule, states: Sequence[Grid], step: int) -> None:
    """State after ``step`` steps, with the arrows of the messages that produced it."""
    draw_state(
        ax, states[step], schedule, _step_title(schedule, step), end=step == schedule.n_steps
    )
    if step > 0:
        draw_transfers(ax, schedule, step - 1)


def plot_steps(schedule: Schedule, columns: int = 4) -> Figure:
    """Every state of ``schedule``, start to end, as a grid of small panels."""
    states = trace(schedule)
    panels = schedule.n_steps + 1
    rows = -(-panels // columns)
    n, k = schedule.world_size, schedule.n_chunks
    fig, axes = _subplots(
        rows, columns, figsize=(columns * (0.9 + 0.55 * k), rows * (0.5 + 0.5 * n))
    )
    for i, ax in enumerate(axes.flat):
        if i < panels:
            draw_step(ax, schedule, states, i)
        else:
            ax.axis("off")
    fig.suptitle(
        f"{schedule.algorithm} {schedule.collective.replace('_', '-')} on {n} ranks: "
        "red = send and add, blue = send and copy",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- player ---
def _figure_png(fig: Figure) -> str:
    """The figure as base64 PNG, the form notebooks store images in."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def schedule_player(schedule: Schedule, static: bool | None = None):
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

        def __init__(self, schedule: Schedule):
            self.schedule = schedule
            self.states = trace(schedule)
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

            n, k = self.schedule.world_size, self.schedule.n_chunks
            fig, axes = _subplots(1, 1, figsize=(1.6 + 1.1 * k, 0.6 + 0.75 * n))
            ax = axes[0, 0]
            draw_step(ax, self.schedule, self.states, step)
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


def _Player(schedule: Schedule):  # builds the widget class on first use
    return _player_class()(schedule)
