"""``distlab sim`` and the size parser."""

import argparse
import json

import pytest

from distlab.commands import sim as commands
from distlab.core.units import format_size, parse_size, size_range
from distlab.sim import build_schedule, preset, simulate


def run_sim(argv, capsys):
    parser = argparse.ArgumentParser(prog="distlab")
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["sim", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_sizes():
    assert parse_size("4KiB") == 4096 and parse_size("1GiB") == 2**30
    assert (
        parse_size("64MB") == 64_000_000 and parse_size("1.5 KB") == 1500 and parse_size("12") == 12
    )
    assert size_range("4KiB:64KiB") == [4096, 8192, 16384, 32768, 65536]
    assert size_range("1KiB:1MiB", 32) == [2**10, 2**15, 2**20]
    assert size_range("4KiB,1MiB") == [4096, 2**20]
    assert format_size(4096) == "4 KiB" and format_size(3 * 2**30) == "3 GiB"
    for bad in ("0", "-4KiB", "4 parsecs", "0.5B", ""):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
    with pytest.raises(ValueError, match="ends below its start"):
        size_range("1MiB:4KiB")


def test_json_records_match_the_replay(capsys):
    out = run_sim(
        [
            "--algorithm",
            "ring,tree",
            "--cluster",
            "dgx-h100",
            "--nodes",
            "2",
            "--sizes",
            "4KiB:16KiB",
            "--json",
        ],
        capsys,
    )
    records = json.loads(out)
    assert [(r["algorithm"], r["bytes"]) for r in records] == [
        (a, s) for a in ("ring", "tree") for s in (4096, 8192, 16384)
    ]
    cluster = preset("dgx-h100", nodes=2)
    expected = simulate(build_schedule("ring_all_reduce", 16), cluster, 8192)
    ring_8k = records[1]
    assert ring_8k["world_size"] == 16 and ring_8k["count"] == 2048
    assert ring_8k["time_s"] == pytest.approx(expected.time_s)
    assert ring_8k["busbw_GBps"] == pytest.approx(expected.busbw / 1e9)
    assert ring_8k["bottleneck"].startswith("node")  # the inter-node hop limits the ring


def test_table_and_cluster_file(tmp_path, capsys):
    spec = tmp_path / "box.yaml"
    spec.write_text("preset: pcie-8gpu\n")
    out = run_sim(
        ["--cluster-file", str(spec), "--algorithm", "halving_doubling", "--sizes", "1MiB"], capsys
    )
    assert "halving_doubling all_reduce on pcie-8gpu: 8 ranks" in out
    assert "busbw (GB/s)" in out and "1 MiB" in out


def test_all_to_all_and_hierarchical(capsys):
    out = run_sim(
        ["--collective", "all_to_all", "--algorithm", "pairwise", "--sizes", "1MiB", "--json"],
        capsys,
    )
    assert json.loads(out)[0]["collective"] == "all_to_all"
    out = run_sim(
        ["--algorithm", "hierarchical_shard", "--nodes", "4", "--sizes", "1GiB", "--json"], capsys
    )
    assert json.loads(out)[0]["bytes_per_link_class"]["network"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cluster", "dgx-9000"], "unknown cluster preset 'dgx-9000'"),
        (["--nodes", "0"], "nodes must be an integer >= 1"),
        (["--world-size", "64"], "64 ranks but cluster 'dgx-h100' has only 32 GPUs"),
        (["--sizes", "0:1MiB"], "size '0'"),
        (["--algorithm", "spiral"], "no algorithm 'spiral' for collective 'all_reduce'"),
    ],
)
def test_bad_input_is_a_value_error(argv, message, capsys):
    with pytest.raises(ValueError, match=message):
        run_sim(argv, capsys)
