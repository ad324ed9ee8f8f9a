"""``distlab bench``: time every collective and algorithm, nccl-tests style.

For each (collective, algorithm, size) every rank runs a few warm-up
iterations, then ``iters`` timed ones between two barriers; the time of an
iteration is the slowest rank's average. Bandwidths follow nccl-tests
(PERFORMANCE.md in NVIDIA/nccl-tests):

* ``algbw = size / time``, where ``size`` is the buffer size nccl-tests
  reports (all-reduce: the buffer; all-gather: the gathered output;
  reduce-scatter: the full input; all-to-all: the send buffer);
* ``busbw = algbw * factor``, the factor making it comparable with the
  hardware's link speed whatever the world size ``n``: all-reduce
  ``2(n-1)/n``, reduce-scatter and all-gather ``(n-1)/n``, all-to-all
  ``(n-1)/n``, broadcast and reduce ``1``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}

#: collective -> algorithms benchmarked (``builtin`` = torch.distributed's own)
ALGORITHMS = {
    "all_reduce": [
        "builtin",
        "ring",
        "tree",
        "double_binary_tree",
        "halving_doubling",
        "hierarchical",
        "naive",
    ],
    "reduce_scatter": ["builtin", "ring"],
    "all_gather": ["builtin", "ring"],
    "broadcast": ["builtin", "tree"],
    "reduce": ["builtin", "tree"],
    "all_to_all": ["builtin", "pairwise"],
}

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


@dataclass
class BenchRecord:
    collective: str
    algorithm: str
    world_size: int
    backend: str
    dtype: str
    bytes: int
    count: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float


def parse_size(text: str) -> int:
    """'4KiB' -> 4096, '64MiB' -> 67108864, '1000' -> 1000."""
    for unit in sorted(UNITS, key=len, reverse=True):
        if text.endswith(unit):
            number = text[: -len(unit)]
            break
    else:
        unit, number = "B", text
    try:
        value = int(float(number) * UNITS[unit])
    except ValueError:
        raise ValueError(f"bad size {text!r}; use e.g. 4KiB, 1MiB, 65536") from None
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def parse_sizes(text: str) -> list[int]:
    """'4KiB:64MiB' -> 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB (x16 steps, last one included);
    '4KiB,1MiB' -> those two."""
    if ":" in text:
        low, high = (parse_size(part) for part in text.split(":", 1))
        sizes = []
        size = low
        while size < high:
            sizes.append(size)
            size *= 16
        return sizes + [high]
    return [parse_size(part) for part in text.split(",")]


def format_size(n: int) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return f"{n}B"


def _iterations(size: int) -> int:
    return max(3, min(50, (32 << 20) // size))


def _bench_worker(rank, world_size, collectives, algorithms, sizes, dtype_name, iters, backend):
    """Runs on every rank; returns BenchRecords (rank 0's list is the answer)."""
    import time

    import torch
    import torch.distributed as dist

    from distlab import collectives as dc

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    dtype = getattr(torch, dtype_name)
    element = torch.tensor([], dtype=dtype).element_size()
    n = world_size

    def make_op(collective, algorithm, size):
        count = max(1, size // element)
        if collective == "all_reduce":
            x = torch.ones(count, dtype=dtype, device=device)
            if algorithm == "builtin":
                return count, lambda: dist.all_reduce(x)
            if algorithm == "hierarchical":
                return count, lambda: dc.hierarchical_all_reduce(x, ranks_per_node=2)
            return count, lambda: dc.ALL_REDUCE[algorithm](x)
        if collective in ("reduce_scatter", "all_gather"):
            per_rank = max(1, count // n)
            big = torch.ones(per_rank * n, dtype=dtype, device=device)
            small = torch.ones(per_rank, dtype=dtype, device=device)
            if collective == "reduce_scatter":
                fn = (
                    dist.reduce_scatter_tensor if algorithm == "builtin" else dc.ring_reduce_scatter
                )
                return per_rank * n, lambda: fn(small, big)
            fn = dist.all_gather_into_tensor if algorithm == "builtin" else dc.ring_all_gather
            return per_rank * n, lambda: fn(big, small)
        if collective in ("broadcast", "reduce"):
            x = torch.ones(count, dtype=dtype, device=device)
            if collective == "broadcast":
                return count, (lambda: dist.broadcast(x, 0)) if algorithm == "builtin" else (
                    lambda: dc.tree_broadcast(x, 0)
                )
            return count, (lambda: dist.reduce(x, 0)) if algorithm == "builtin" else (
                lambda: dc.tree_reduce(x, 0)
            )
        if collective == "all_to_all":
            per_rank = max(1, count // n)
            send = [torch.ones(per_rank, dtype=dtype, device=device) for _ in range(n)]
            recv = [torch.empty(per_rank, dtype=dtype, device=device) for _ in range(n)]
            fn = dist.all_to_all if algorithm == "builtin" else dc.all_to_all
            return per_rank * n, lambda: fn(recv, send)
        raise ValueError(collective)

    def sync():
        if backend == "nccl":
            torch.cuda.synchronize()
        dist.barrier()

    records = []
    for collective in collectives:
        for algorithm in ALGORITHMS[collective]:
            if algorithms and algorithm not in algorithms:
                continue
            if n == 1 and algorithm != "builtin":
                pass
            for size in sizes:
                count, op = make_op(collective, algorithm, size)
                repeat = iters or _iterations(size)
                for _ in range(2):
                    op()
                sync()
                start = time.perf_counter()
                for _ in range(repeat):
                    op()
                sync()
                elapsed = torch.tensor(
                    [(time.perf_counter() - start) / repeat], dtype=torch.float64
                )
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                seconds = elapsed.item()
                nbytes = count * element
                algbw = nbytes / seconds / 1e9
                records.append(
                    asdict(
                        BenchRecord(
                            collective,
                            algorithm,
                            n,
                            backend,
                            dtype_name,
                            nbytes,
                            count,
                            seconds,
                            algbw,
                            algbw * BUSBW_FACTOR[collective](n),
                        )
                    )
                )
    return records


def run_bench(
    *,
    world_sizes=(2, 4),
    collectives=("all_reduce",),
    algorithms=None,
    sizes=(4096, 1 << 16, 1 << 20, 16 << 20, 64 << 20),
    dtype: str = "float32",
    iters: int | None = None,
    backend: str = "gloo",
) -> list[dict]:
    """Benchmark and return records (dicts with the :class:`BenchRecord` fields)."""
    from distlab.launch import run

    unknown = [c for c in collectives if c not in ALGORITHMS]
    if unknown:
        raise ValueError(f"unknown collective(s) {unknown}; allowed: {sorted(ALGORITHMS)}")
    records = []
    for n in world_sizes:
        if n < 1:
            raise ValueError(f"world sizes must be >= 1, got {n}")
        results = run(
            _bench_worker,
            n,
            backend=backend,
            timeout=1800,
            args=(list(collectives), list(algorithms or []), list(sizes), dtype, iters, backend),
        )
        records.extend(results[0])
    return records


def print_table(records: list[dict], file=sys.stdout) -> None:
    """nccl-tests-like table, one block per (collective, world size)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, width=120)
    keys = sorted({(r["collective"], r["world_size"]) for r in records}, key=lambda k: (k[0], k[1]))
    for collective, n in keys:
        rows = [r for r in records if r["collective"] == collective and r["world_size"] == n]
        table = Table(title=f"{collective}, {n} ranks, {rows[0]['backend']}, {rows[0]['dtype']}")
        for column in (
            "algorithm",
            "size",
            "count",
            "time (us)",
            "algbw (GB/s)",
            "busbw (GB/s)",
            "busbw / builtin",
        ):
            table.add_column(column, justify="right")
        builtin = {r["bytes"]: r["busbw_GBps"] for r in rows if r["algorithm"] == "builtin"}
        for r in rows:
            ratio = (
                r["busbw_GBps"] / builtin[r["bytes"]] if builtin.get(r["bytes"]) else float("nan")
            )
            table.add_row(
                r["algorithm"],
                format_size(r["bytes"]),
                str(r["count"]),
                f"{r['time_s'] * 1e6:.1f}",
                f"{r['algbw_GBps']:.3f}",
                f"{r['busbw_GBps']:.3f}",
                f"{ratio:.2f}",
            )
        console.print(table)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="time distlab's collectives against torch.distributed's (nccl-tests style)"
    )
    p.add_argument("--world-sizes", default="2,4", help="comma-separated, default 2,4")
    p.add_argument(
        "--collectives",
        default="all_reduce",
        help=f"comma-separated or 'all'; from {', '.join(ALGORITHMS)}",
    )
    p.add_argument(
        "--algorithms",
        default=None,
        help="comma-separated subset (default: all for each collective)",
    )
    p.add_argument(
        "--sizes", default="4KiB:64MiB", help="'4KiB:64MiB' (x16 steps) or a list '4KiB,1MiB'"
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--iters", type=int, default=None, help="timed iterations per point (default: by size)"
    )
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--json", action="store_true", help="print JSON records instead of tables")
    p.set_defaults(func=_main)


def _main(args) -> int:
    collectives = list(ALGORITHMS) if args.collectives == "all" else args.collectives.split(",")
    try:
        world_sizes = [int(w) for w in args.world_sizes.split(",")]
    except ValueError:
        raise ValueError(
            f"--world-sizes must be integers like 2,4, got {args.world_sizes!r}"
        ) from None
    records = run_bench(
        world_sizes=world_sizes,
        collectives=collectives,
        algorithms=args.algorithms.split(",") if args.algorithms else None,
        sizes=parse_sizes(args.sizes),
        dtype=args.dtype,
        iters=args.iters,
        backend=args.backend,
    )
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        print_table(records)
    return 0
