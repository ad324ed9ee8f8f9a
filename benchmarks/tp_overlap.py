"""The collective matmul, serial against overlapped, and the TP roofline's max useful tp.

    python benchmarks/tp_overlap.py [--ranks 2,4] [--sizes 256x1024x512,1024x1024x512]
                                    [--repeats 5] [--models 7B,70B,175B]

For each number of gloo ranks, one launch runs the four functions of
:mod:`distlab.parallel.tensor.overlap` taking turns, repeat by repeat, on each size
``TxKxN``: T tokens per rank, K input features, N output features per rank for the
column side; the row side does the same FLOPs per rank (x of t T tokens and K/t features,
a K/t x t N row shard of W, leaving T tokens of t N features on each rank):

* ``AG+matmul``: :func:`serial_gather_matmul` against :func:`overlapped_gather_matmul`;
* ``matmul+RS``: :func:`serial_matmul_reduce_scatter` against
  :func:`overlapped_matmul_reduce_scatter`.

It prints, per side, size and rank count, the median over repeats of the slowest
rank's wall time (first interval to last of its timeline) and of the largest exposed
communication (:func:`exposed_communication_seconds`) of any rank; the first repeat
warms up and is dropped. Then the roofline: :func:`distlab.calc.tp_roofline.max_useful_tp`
on an H100 over NVLink 4 and InfiniBand NDR (peak FLOP/s, micro-batch 1, the forward and
backward passes counted: the library's default ``passes="forward_backward"``), and the
bandwidth-only bound, for a few model presets.

Timings on a shared CPU are noisy, and on a CPU the "overlap" only helps while a core
is free for gloo's threads: with more ranks than cores they take turns with the matmul.

Measured on 2 shared CPU cores under a load average of ~12 from other jobs (2026-11-25,
5 repeats; milliseconds)::

    side       ranks        T x K x N  serial ms overlap ms  speedup  exposed serial  exposed overlap
    AG+matmul      2     256x1024x512      105.9      114.4    0.93x            15.8              6.0
    AG+matmul      2    1024x1024x512      605.3      509.8    1.19x            43.9              1.6
    matmul+RS      2     256x1024x512      164.2      159.3    1.03x            31.4              5.3
    matmul+RS      2    1024x1024x512      789.3      648.3    1.22x            80.1             15.2
    AG+matmul      4     256x1024x512      304.2      318.5    0.96x            66.4             90.0
    AG+matmul      4    1024x1024x512     1586.9     1630.6    0.97x           222.2             29.7
    matmul+RS      4     256x1024x512      525.1      521.5    1.01x           345.7             76.4
    matmul+RS      4    1024x1024x512     1557.4     1169.8    1.33x           768.7             68.7

    model                 NVLink 4        InfiniBand NDR
    7B                   8 ( 10.8)             2 (  2.1)
    70B                 16 ( 20.2)             3 (  3.1)
    175B                20 ( 26.9)             3 (  3.9)

Where compute dominates (1024 tokens per rank) the ring hides most of the communication;
on the small size with 4 ranks on 2 cores it does not (the ranks' ring steps wait on
each other's turns on the cores).
"""

from __future__ import annotations

import argparse
import statistics

import distlab
from distlab.calc import tp_roofline

SIDES = ("AG+matmul", "matmul+RS")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts")
    parser.add_argument("--sizes", default="256x1024x512,1024x1024x512", help="TxKxN, ...")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="7B,70B,175B", help="model presets for the roofline")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    print(
        f"{'side':<10} {'ranks':>5} {'T x K x N':>16} {'serial ms':>10} {'overlap ms':>10} "
        f"{'speedup':>8} {'exposed serial':>15} {'exposed overlap':>16}"
    )
    for world in (int(r) for r in args.ranks.split(",")):
        per_rank = distlab.run(
            _worker, world, args=(sizes, args.repeats), timeout=600, show_output=False
        )
        for side in SIDES:
            for size in sizes:
                print(_row(side, world, size, [r[side][size] for r in per_rank]))
    print()
    print(_roofline_table(args.models.split(",")))


def _row(side: str, world: int, size: tuple[int, int, int], ranks: list[dict]) -> str:
    def median_of_slowest(version: str, what: str) -> float:
        repeats = zip(*(r[version][what] for r in ranks), strict=True)
        return statistics.median(max(values) for values in repeats) * 1e3

    serial, overlapped = (median_of_slowest(v, "wall") for v in ("serial", "overlapped"))
    exposed = [median_of_slowest(v, "exposed") for v in ("serial", "overlapped")]
    shape = "x".join(str(v) for v in size)
    return (
        f"{side:<10} {world:>5} {shape:>16} {serial:>10.1f} {overlapped:>10.1f} "
        f"{serial / overlapped:>7.2f}x {exposed[0]:>15.1f} {exposed[1]:>16.1f}"
    )


def _roofline_table(models: list[str]) -> str:
    peak = tp_roofline.H100_PEAK_FLOPS
    title = (
        f"TP roofline on an H100 ({peak / 1e12:.0f} TFLOP/s peak, micro-batch 1): the largest t "
        "whose layer compute covers its TP communication, forward + backward (bandwidth-only "
        "bound in brackets)"
    )
    lines = [
        title,
        f"{'model':<8}" + "".join(f"{name:>22}" for name in tp_roofline.H100_LINKS),
    ]
    for model in models:
        useful = tp_roofline.max_useful_tp_on_h100(model)
        cells = []
        for name, link in tp_roofline.H100_LINKS.items():
            bound = tp_roofline.bandwidth_bound_tp(model, bandwidth=link.bandwidth, peak_flops=peak)
            cells.append(f"{useful[name]:>14d} ({bound:5.1f})")
        lines.append(f"{model:<8}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def _inputs(rank: int, world: int, size: tuple[int, int, int]):
    """Each side's inputs for one rank: (x, w) of the same FLOPs per rank."""
    import torch

    tokens, k, n = size
    gen = torch.Generator().manual_seed(rank)
    gather = (torch.randn(tokens, k, generator=gen), torch.randn(k, n, generator=gen))
    # row side: every token, K/world features of x; a K/world x N*world row shard of W
    scatter = (
        torch.randn(tokens * world, k // world, generator=gen),
        torch.randn(k // world, n * world, generator=gen),
    )
    return {"AG+matmul": gather, "matmul+RS": scatter}


def _worker(rank, world, sizes, repeats):
    from distlab.parallel.tensor import overlap as o

    versions = {
        "AG+matmul": {"serial": o.serial_gather_matmul, "overlapped": o.overlapped_gather_matmul},
        "matmul+RS": {
            "serial": o.serial_matmul_reduce_scatter,
            "overlapped": o.overlapped_matmul_reduce_scatter,
        },
    }
    out = {side: {} for side in SIDES}
    for size in sizes:
        inputs = _inputs(rank, world, size)
        for side, pair in versions.items():
            record = {v: {"wall": [], "exposed": []} for v in pair}
            for repeat in range(repeats + 1):
                for version, fn in pair.items():
                    _, timeline = fn(*inputs[side])
                    if repeat:  # the first repeat warms up
                        record[version]["wall"].append(timeline.end - timeline.start)
                        record[version]["exposed"].append(o.exposed_communication_seconds(timeline))
            out[side][size] = record
    return out


if __name__ == "__main__":
    main()
