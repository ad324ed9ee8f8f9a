"""`distlab bench`: size parsing, busbw factors, and a tiny real run through the CLI."""

import json

import pytest

from distlab.cli import main
from distlab.commands.bench import DEFAULT_SIZES
from distlab.core.units import format_size, parse_size, size_range
from distlab.sim.bandwidth import busbw_factor


def test_sizes_parse_like_nccl_tests():
    assert parse_size("4KiB") == 4096
    assert parse_size("64MiB") == 64 << 20
    assert size_range(DEFAULT_SIZES) == [4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    assert size_range("4KiB,1MiB") == [4096, 1 << 20]
    assert format_size(64 << 20) == "64 MiB"


@pytest.mark.parametrize("bad", ["", "abc", "-4KiB", "0"])
def test_bad_sizes_are_named(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_busbw_factors_are_the_nccl_tests_ones():
    assert busbw_factor("all_reduce", 4) == 2 * 3 / 4
    assert busbw_factor("all_gather", 4) == 3 / 4
    assert busbw_factor("reduce_scatter", 8) == 7 / 8
    assert busbw_factor("broadcast", 8) == 1


@pytest.mark.parametrize("mode", [[], ["--side-by-side"]], ids=["job-each", "side-by-side"])
def test_bench_cli_json_on_two_ranks(capsys, mode):
    code = main(["bench", "--world-sizes", "2", "--sizes", "4KiB", "--iters", "2",
                 "--collectives", "all_reduce,all_gather", "--algorithms", "builtin,ring", "--json",
                 *mode])
    assert code == 0
    records = json.loads(capsys.readouterr().out)
    assert {(r["collective"], r["algorithm"]) for r in records} == {
        ("all_reduce", "builtin"), ("all_reduce", "ring"), ("all_gather", "builtin"), ("all_gather", "ring"),
    }
    for r in records:
        assert r["world_size"] == 2 and r["bytes"] == 4096 and r["time_s"] > 0
        factor = 1.0 if r["collective"] == "all_reduce" else 0.5
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)


def test_bench_cli_rejects_unknown_collective(capsys):
    assert main(["bench", "--collectives", "gossip"]) == 2
    assert "unknown collective" in capsys.readouterr().err
