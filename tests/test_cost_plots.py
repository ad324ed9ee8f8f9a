"""The cost figures draw what distlab.sim computes and what the bench measured (plain Figures)."""

import pytest
from matplotlib.figure import Figure

from distlab.sim import PRESETS, closed_form, preset
from distlab.sim.topology import IB_NDR, NVLINK4
from distlab.viz import cost_plots


def _bar_heights(ax) -> list[float]:
    return [patch.get_height() for patch in ax.patches]


def test_preset_links_are_distinct_and_fastest_first():
    links = cost_plots.preset_links()
    names = [link.name for link in links]
    assert len(names) == len(set(names))
    bandwidths = [link.bandwidth for link in links]
    assert bandwidths == sorted(bandwidths, reverse=True)
    every = {
        link.name
        for cluster in PRESETS.values()
        for link in (cluster.intra, cluster.far_intra, cluster.inter)
        if link is not None
    }
    assert set(names) == every
    only_h100 = cost_plots.preset_links({"dgx-h100": preset("dgx-h100")})
    assert [link.name for link in only_h100] == [NVLINK4.name, IB_NDR.name]


def test_link_bandwidths_draws_one_direction_and_both():
    presets = {"dgx-h100": preset("dgx-h100")}
    fig = cost_plots.plot_link_bandwidths(presets)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    widths = [patch.get_width() for patch in ax.patches]
    both, one_way = widths[:2], widths[2:]  # light bars first, dark bars on top
    assert one_way == [NVLINK4.bandwidth / 1e9, IB_NDR.bandwidth / 1e9]
    assert both == [2 * w for w in one_way]
    assert ax.get_xscale() == "log"
    rows = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks())}
    assert rows[NVLINK4.name] > rows[IB_NDR.name], "the fastest link is drawn at the top"
    with pytest.raises(ValueError, match="presets are empty"):
        cost_plots.plot_link_bandwidths({})


def test_cost_breakdown_stacks_the_closed_form_terms():
    sizes = [4096, 2**30]
    algorithms = ["ring_all_reduce", "tree_all_reduce"]
    fig = cost_plots.plot_cost_breakdown(8, NVLINK4, sizes, algorithms)
    assert len(fig.axes) == len(sizes)
    for ax, size in zip(fig.axes, sizes):
        heights = _bar_heights(ax)  # per algorithm: latency bar, then bandwidth bar
        for i, name in enumerate(algorithms):
            cost = closed_form(name, 8)
            latency, bandwidth = heights[2 * i], heights[2 * i + 1]
            assert latency == pytest.approx(cost.alpha_terms * NVLINK4.alpha * 1e6)
            assert bandwidth == pytest.approx(cost.beta_factor * size * NVLINK4.beta * 1e6)
            assert latency + bandwidth == pytest.approx(cost.time(size, NVLINK4) * 1e6)
    with pytest.raises(ValueError, match="sizes"):
        cost_plots.plot_cost_breakdown(8, NVLINK4, [])
    with pytest.raises(ValueError, match="algorithms"):
        cost_plots.plot_cost_breakdown(8, NVLINK4, [4096], algorithms=[])
    with pytest.raises(ValueError, match="no closed form"):
        cost_plots.plot_cost_breakdown(8, NVLINK4, [4096], algorithms=["magic_all_reduce"])


def _record(algorithm, n_bytes, time_s, collective="all_reduce", world_size=4):
    return {
        "collective": collective,
        "algorithm": algorithm,
        "world_size": world_size,
        "bytes": n_bytes,
        "time_s": time_s,
    }


def test_bench_bars_are_the_measured_times():
    records = [
        _record("builtin", 4096, 1e-3),
        _record("ring", 4096, 2e-3),
        _record("builtin", 2**22, 5e-3),
        _record("ring", 2**22, 8e-3),
    ]
    fig = cost_plots.plot_bench(records)
    ax = fig.axes[0]
    assert _bar_heights(ax) == pytest.approx([1.0, 5.0, 2.0, 8.0])  # ms, algorithm by algorithm
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4 KiB", "4 MiB"]
    assert ax.get_yscale() == "log"


def test_bench_refuses_mixed_or_empty_records():
    with pytest.raises(ValueError, match="no bench records"):
        cost_plots.plot_bench([])
    mixed = [_record("ring", 4096, 1e-3), _record("ring", 4096, 1e-3, world_size=2)]
    with pytest.raises(ValueError, match="one collective on one world size"):
        cost_plots.plot_bench(mixed)
