"""How long `distlab plan` takes to enumerate every layout, up to 16,384 GPUs.

    python benchmarks/planner_scale.py

Prints one row per (model, GPUs, global batch): layouts enumerated, layouts
that fit, the winner, and the wall time (best of 3). The issue's target is
under 2 s at 16,384 GPUs.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from distlab.calc.planner import plan
from distlab.sim.topology import preset

CASES = [
    ("7B", "dgx-h100", 1, 256),
    ("70B", "dgx-h100", 16, 1024),
    ("175B", "dgx-a100", 192, 1536),
    ("1B", "dgx-h100", 2048, 16384),
    ("7B", "dgx-h100", 2048, 16384),
    ("70B", "dgx-h100", 2048, 16384),
    ("175B", "dgx-h100", 2048, 4096),
    ("175B", "dgx-h100", 2048, 16384),
]


def main() -> None:
    table = Table(title="Planner enumeration time")
    for name in ("model", "cluster", "GPUs", "global batch", "layouts", "fit", "winner", "time"):
        table.add_column(
            name, justify="left" if name in ("model", "cluster", "winner") else "right"
        )
    worst_at_16k = 0.0
    for model, cluster_name, nodes, batch in CASES:
        cluster = preset(cluster_name, nodes=nodes)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            result = plan(model, cluster, global_batch=batch)
            times.append(time.perf_counter() - start)
        best = min(times)
        if cluster.world_size == 16384:
            worst_at_16k = max(worst_at_16k, best)
        winner = result.best.layout.label() if result.candidates else "(nothing fits)"
        table.add_row(
            model,
            cluster_name,
            str(cluster.world_size),
            str(batch),
            str(result.n_enumerated),
            str(len(result.candidates)),
            winner,
            f"{best:.3f} s",
        )
    console = Console(width=160)
    console.print(table)
    verdict = "meets" if worst_at_16k < 2.0 else "MISSES"
    console.print(f"slowest case at 16,384 GPUs: {worst_at_16k:.3f} s ({verdict} the 2 s target)")


if __name__ == "__main__":
    main()
