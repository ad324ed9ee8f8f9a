"""Notebooks 06 (ZeRO and FSDP) and 07 (tensor and sequence parallelism): their figures and prose.

The figures of notebook 07 come from :mod:`distlab.viz.tensor_plots`: the activation plot has
integer ticks on the tensor-parallel size and draws the selective-recomputation series the
notebook prints; the "f and g" figure names each marker's operator, with one spelling of the
collective in the legend and beside the markers. The prose checks read the solution notebooks'
markdown: no wrapped line that a renderer takes for a numbered list item, and no reference to
documents a learner never saw.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from distlab.calc.memory import activation_bytes_per_layer
from distlab.parallel.tensor.ops import CommEvent
from distlab.viz import tensor_plots

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {
    name: ROOT / "solutions" / name / f"{name}.ipynb"
    for name in ("06-zero-and-fsdp", "07-tensor-and-sequence-parallelism")
}
SHAPE = {"seq_len": 16, "micro_batch": 2, "hidden": 64, "heads": 8}


def table2(t: int, sequence_parallel: bool, recompute: str = "none") -> float:
    return activation_bytes_per_layer(
        **SHAPE, tp=t, sequence_parallel=sequence_parallel, recompute=recompute
    )


def test_activation_plot_has_integer_ticks_and_the_selective_series():
    measured = {(1, False): table2(1, False), (2, False): table2(2, False)}
    measured[(2, True)] = table2(2, True)
    selective = {2: table2(2, True, "selective")}
    fig = tensor_plots.plot_activation_bytes(measured, selective=selective, **SHAPE)
    ax = fig.axes[0]

    ticks = list(ax.get_xticks())
    assert ticks == [1, 2], ticks  # the t that divide 8 heads and 16 tokens, up to 2
    assert all(float(t).is_integer() for t in ticks)
    lines = {line.get_label(): line for line in ax.lines}
    line = lines["TP + SP + selective recompute: Table 2"]
    want = [table2(t, True, "selective") / 2**10 for t in (1, 2)]
    assert list(line.get_xdata()) == [1, 2]
    assert list(line.get_ydata()) == pytest.approx(want)
    points = {c.get_label(): c for c in ax.collections}
    dots = points["TP + SP + selective recompute: measured"].get_offsets()
    assert [tuple(p) for p in dots] == [(2, pytest.approx(selective[2] / 2**10))]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # the legend sits beside the axes, on none of the lines
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_activation_plot_without_selective_draws_two_series_with_integer_ticks():
    measured = {(t, sp): table2(t, sp) for t in (1, 2, 4) for sp in (False, True)}
    ax = tensor_plots.plot_activation_bytes(measured, **SHAPE).axes[0]
    assert [line.get_label() for line in ax.lines] == ["TP: Table 2", "TP + SP: Table 2"]
    assert list(ax.get_xticks()) == [1, 2, 4]


def tp_block_events() -> list[CommEvent]:
    """What a tensor-parallel block logs: g after attention and the MLP, f's backward."""
    elements = 2 * 8 * 32
    return [
        CommEvent("forward", "all_reduce", "attn.proj out", elements),
        CommEvent("forward", "all_reduce", "mlp.fc2 out", elements),
        CommEvent("backward", "all_reduce", "mlp in", elements),
        CommEvent("backward", "all_reduce", "attn in", elements),
    ]


def test_block_figure_labels_f_and_g_in_one_spelling():
    ax = tensor_plots.plot_block_collectives(tp_block_events()).axes[0]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert sorted(legend) == ["f: all-reduce", "g: all-reduce"]
    beside = [t.get_text() for t in ax.texts if t.get_text() not in tensor_plots.STAGES]
    assert sorted(beside) == ["f: all-reduce"] * 2 + ["g: all-reduce"] * 2
    # markers: g in forward, f in backward, each with its legend entry
    by_label = {}
    for line in ax.lines:
        by_label.setdefault(line.get_label(), []).append(line.get_ydata()[0])
    assert min(by_label["g: all-reduce"]) > 1 > max(by_label["f: all-reduce"])
    assert not [s for s in legend + beside if "_" in s]


def test_operator_names_follow_the_papers():
    assert tensor_plots.operator_name("attn in", "all_reduce") == "f"
    assert tensor_plots.operator_name("mlp.fc2 out", "all_reduce") == "g"
    assert tensor_plots.operator_name("mlp in", "all_gather") == "g"
    assert tensor_plots.operator_name("attn in (re-gather)", "all_gather") == "g"
    assert tensor_plots.operator_name("attn.proj out", "reduce_scatter") == "g-bar"
    with pytest.raises(ValueError, match="'broadcast'"):
        tensor_plots.operator_name("attn in", "broadcast")
    with pytest.raises(ValueError, match="'nowhere'"):
        tensor_plots.operator_name("nowhere", "all_reduce")


def test_sequence_parallel_block_figure_names_g_and_g_bar():
    events = [
        CommEvent("forward", "all_gather", "attn in", 1),
        CommEvent("forward", "reduce_scatter", "attn.proj out", 1),
        CommEvent("backward", "all_gather", "attn.proj out", 1),
        CommEvent("backward", "reduce_scatter", "attn in", 1),
    ]
    ax = tensor_plots.plot_block_collectives(events).axes[0]
    legend = sorted(text.get_text() for text in ax.get_legend().get_texts())
    assert legend == [
        r"$\bar{g}$: all-gather",
        r"$\bar{g}$: reduce-scatter",
        "g: all-gather",
        "g: reduce-scatter",
    ]


ORDERED = re.compile(r"^\s*\d+[.)](\s|$)")


def unintended_list_items(markdown: str) -> list[str]:
    """Lines that start like an ordered-list item (``2)``, ``12.``) inside a paragraph:
    renderers such as JupyterLab's turn them into list items. An ordered list is intended
    when its first item follows a blank line; its later items and their indented
    continuation lines may follow each other."""
    found, in_list, previous_blank, fence = [], False, True, False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        blank = not line.strip()
        if ORDERED.match(line):
            if not (previous_blank or in_list):
                found.append(line)
            in_list = True
        elif not blank and previous_blank and not line.startswith(" "):
            in_list = False
        previous_blank = blank
    return found


def markdown_cells(name: str):
    nb = nbformat.read(NOTEBOOKS[name], as_version=4)
    return [(cell.get("id"), cell.source) for cell in nb.cells if cell.cell_type == "markdown"]


def test_the_list_check_catches_a_wrapped_number():
    wrapped = "reduce-scatter it (distlab's, from notebook\n  02) into a tensor"
    assert unintended_list_items(wrapped) == ["  02) into a tensor"]
    intended = "per unit:\n\n1. **forward**: gather;\n2. **backward**: gather\n   again;\n3. step."
    assert unintended_list_items(intended) == []


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_no_wrapped_line_renders_as_a_list_item(name):
    bad = {
        cid: lines for cid, text in markdown_cells(name) if (lines := unintended_list_items(text))
    }
    assert not bad, f"{name}: lines that would render as numbered list items: {bad}"


UNSEEN_SOURCES = re.compile(
    r"this course started from|seed documents?|the seeds|course'?s source notes|source notes",
    re.IGNORECASE,
)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_prose_names_no_source_a_learner_never_saw(name):
    bad = {
        cid: UNSEEN_SOURCES.findall(text)
        for cid, text in markdown_cells(name)
        if UNSEEN_SOURCES.search(text)
    }
    assert not bad, f"{name}: markdown refers to documents a learner never saw: {bad}"


def test_notebook_07_runs_context_parallelism_and_tp_dropout_from_the_library():
    """Issues 26 and 29: Ulysses, the K/V all-gather and the RNG tracker are imported from
    distlab, not written inline (no collective called by hand in a code cell)."""
    nb = nbformat.read(NOTEBOOKS["07-tensor-and-sequence-parallelism"], as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for module, names in {
        "distlab.parallel.context.ulysses": ("Ulysses", "ulysses_attention"),
        "distlab.parallel.context.gather": ("KVGather", "all_gather_attention"),
        "distlab.parallel.tensor.rng": ("RNGTracker", "tensor_parallel_masks"),
    }.items():
        imported = re.search(rf"from {re.escape(module)} import ([^\n]+)", code)
        assert imported and all(n in imported.group(1) for n in names), module
    assert not re.search(r"\ball_to_all\(", code), "an all-to-all written inline"
