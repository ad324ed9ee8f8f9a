"""`distlab memory`, `distlab bubble`, `distlab plan`, the calc plots, and torch-free imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import matplotlib
import pytest

matplotlib.use("Agg")

from distlab.calc import pipeline
from distlab.commands.calc import standalone_parser
from distlab.viz import calc_plots


def run(argv, capsys):
    args = standalone_parser().parse_args(argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_memory_json_reproduces_zero_figure_1(capsys):
    out = run(
        ["memory", "--params", "7.5e9", "--recipe", "mixed_adam", "--dp", "64", "--json"], capsys
    )
    totals = [round(r["total"] / 1e9, 1) for r in json.loads(out)["rows"]]
    assert totals == [120.0, 31.4, 16.6, 1.9]


def test_memory_table(capsys):
    out = run(["memory", "--model", "7B", "--dp", "8"], capsys)
    assert "ZeRO stage" in out and "P_os+g+p" in out and "GiB" in out


def test_bubble_json_and_table(capsys):
    rows = json.loads(run(["bubble", "--stages", "4", "--micro-batches", "8", "--json"], capsys))[
        "rows"
    ]
    by = {r["schedule"]: r for r in rows}
    assert by["gpipe"]["bubble_of_total"] == pytest.approx(3 / 11)
    assert (
        by["1f1b"]["in_flight_micro_batches"] == 4 and by["gpipe"]["in_flight_micro_batches"] == 8
    )
    assert by["interleaved"]["bubble_over_ideal"] == pytest.approx(3 / 16)
    for r in rows:
        assert r["bubble_counted_from_schedule"] == pytest.approx(r["bubble_of_total"])
    out = run(["bubble", "--stages", "4", "--micro-batches", "8"], capsys)
    assert "27.27%" in out and "15.79%" in out  # 1F1B 3/11, interleaved v=2 3/19
    # the interleaved schedule needs m to be a multiple of p: no replayed value, not a crash
    rows = json.loads(run(["bubble", "--stages", "4", "--micro-batches", "6", "--json"], capsys))
    assert rows["rows"][2]["bubble_counted_from_schedule"] is None


def test_plan_json_and_table(capsys):
    argv = [
        "plan",
        "--model",
        "70B",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "16",
        "--global-batch",
        "1024",
    ]
    data = json.loads(run([*argv, "--json", "--top", "3"], capsys))
    assert data["n_feasible"] > 0 and len(data["candidates"]) == 3
    best = data["candidates"][0]
    assert best["layout"]["tp"] * best["layout"]["pp"] * best["layout"]["dp"] == 128
    assert any("Why TP stays inside" in line for line in data["explanation"])
    out = run(argv, capsys)
    assert "TP/PP/DP" in out and "Winner:" in out


def test_plan_custom_shape_and_cluster_file(tmp_path, capsys):
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"preset": "dgx-a100", "nodes": 2}))
    data = json.loads(
        run(
            [
                "plan",
                "--layers",
                "12",
                "--hidden",
                "768",
                "--heads",
                "12",
                "--seq-len",
                "1024",
                "--cluster-file",
                str(spec),
                "--global-batch",
                "64",
                "--json",
            ],
            capsys,
        )
    )
    assert data["model"]["seq_len"] == 1024 and data["cluster"]["nodes"] == 2


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["memory", "--params", "1e9", "--recipe", "adamw"], "recipe 'adamw'"),
        (["plan", "--model", "70B", "--cluster", "nope", "--global-batch", "8"], "nope"),
        (["plan", "--layers", "12", "--cluster", "dgx-h100", "--global-batch", "8"], "--hidden"),
    ],
)
def test_bad_input_is_one_clear_error(argv, match):
    args = standalone_parser().parse_args(argv)
    with pytest.raises(ValueError, match=match):
        args.func(args)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["memory", "--params", "0"],
            "argument --params: value must be a finite number > 0, got 0",
        ),
        (["bubble", "--stages", "0", "--micro-batches", "4"], "argument --stages: .* got 0"),
        (["plan", "--model", "7x", "--cluster", "dgx-h100", "--global-batch", "8"], "'7x'"),
    ],
)
def test_bad_number_is_refused_while_parsing(argv, match, capsys):
    """Numbers are checked as argparse reads them, so the error names the option."""
    with pytest.raises(SystemExit) as caught:
        standalone_parser().parse_args(argv)
    assert caught.value.code == 2
    assert re.search(match, capsys.readouterr().err)


def test_registered_in_the_distlab_command(capsys):
    from distlab.cli import COMMAND_MODULES
    from distlab.commands import calc

    assert calc in COMMAND_MODULES


def test_plots_return_figures():
    fig = calc_plots.plot_memory_by_zero_stage(7.5e9, dp=64)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert sum(heights) == pytest.approx(120 + 31.40625 + 16.640625 + 1.875)
    fig = calc_plots.plot_bubble_vs_micro_batches(4, max_micro_batches=16, check_points=(8,))
    first = fig.axes[0].lines[0]
    assert list(first.get_ydata())[7] == pytest.approx(pipeline.bubble_fraction(4, 8))
    fig = calc_plots.plot_pipeline_schedule(3, 4, schedule="gpipe")
    assert len(fig.axes[0].patches) == 3 * 2 * 4
    with pytest.raises(ValueError, match="unit"):
        calc_plots.plot_memory_by_zero_stage(1e9, unit="gigs")


def test_import_distlab_calc_does_not_import_torch():
    """``distlab.calc``, the planner and the ``distlab calc`` commands load neither torch nor
    matplotlib (numpy they do: the rank layout of distlab.core.layout uses it)."""
    code = (
        "import sys, distlab.calc; "
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]; "
        "assert not bad, bad; "
        "import distlab.calc.planner, distlab.commands.calc; "
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
