"""Wrong answers to notebook 08's exercises."""

ASSIGNMENT = "08-pipeline-parallelism"

_WARMUP = "        warmup = min(p - r - 1, m)"

MUTANTS = {
    "one-f-one-b": [
        (
            "calls the library's generator",
            [("    ranks = []\n", "    return one_f_one_b(p, m)\n    ranks = []\n")],
        ),
        (
            "warm-up not capped at m (wrong when m < p - 1)",
            [(_WARMUP, "        warmup = p - r - 1")],
        ),
        ("one warm-up forward too many", [(_WARMUP, "        warmup = min(p - r, m)")]),
        ("warm-up counted from the wrong end (r, not p - r - 1)", [(_WARMUP, "        warmup = min(r, m)")]),
        ("GPipe order: all forwards first", [(_WARMUP, "        warmup = m")]),
        (
            "backward before forward in the steady state",
            [
                (
                    "            row += [Action(0, \"F\", warmup + k), Action(0, \"B\", k)]",
                    "            row += [Action(0, \"B\", k), Action(0, \"F\", warmup + k)]",
                )
            ],
        ),
        ("the visible case's p = 4 hard-coded", [(_WARMUP, "        warmup = min(3 - r, m)")]),
    ],
    "idle-share": [
        (
            "divides idle time by busy time",
            [
                (
                    "    return sum(idle) / (len(rank_runs) * step)",
                    "    busy = sum(e.end - e.start for e in entries)\n    return sum(idle) / busy",
                )
            ],
        ),
        (
            "each rank's own span as its step",
            [
                (
                    "    idle = [step - sum(e.end - e.start for e in run.entries) for run in rank_runs]",
                    ("    idle = [max(e.end for e in run.entries) - min(e.start for e in run.entries)\n"
                    "            - sum(e.end - e.start for e in run.entries) for run in rank_runs]"),
                )
            ],
        ),
        ("the worst rank, not the mean", [("    return sum(idle) / (len(rank_runs) * step)", "    return max(idle) / step")]),
        ("rank 0 only", [("    return sum(idle) / (len(rank_runs) * step)", "    return idle[0] / step")]),
        (
            "the step measured on rank 0's actions",
            [
                (
                    "    step = max(e.end for e in entries) - min(e.start for e in entries)",
                    ("    first = rank_runs[0].entries\n"
                    "    step = max(e.end for e in first) - min(e.start for e in first)"),
                )
            ],
        ),
        (
            "calls measured_timeline",
            [
                (
                    "    entries = [e for run in rank_runs for e in run.entries]",
                    "    return measured_timeline(None, rank_runs).bubble_fraction",
                )
            ],
        ),
    ],
    "smallest-m": [
        (
            "the library's bubble_fraction as a default argument",
            [
                (
                    "def smallest_micro_batches(p: int, target: float, virtual_stages: int = 1) -> int:",
                    "def smallest_micro_batches(p, target, virtual_stages=1, _bubble=bubble_fraction):",
                ),
                (
                    "    while (p - 1) / (virtual_stages * m + p - 1) >= target:",
                    ("    name = 'interleaved' if virtual_stages > 1 else '1f1b'\n"
                    "    while _bubble(p, m, schedule=name, virtual_stages=virtual_stages) >= target:"),
                ),
            ],
        ),
        (
            "searches with the library's bubble_fraction",
            [
                (
                    "    while (p - 1) / (virtual_stages * m + p - 1) >= target:",
                    ("    name = 'interleaved' if virtual_stages > 1 else '1f1b'\n"
                    "    while bubble_fraction(p, m, schedule=name, virtual_stages=virtual_stages) >= target:"),
                )
            ],
        ),
        (
            "ignores virtual_stages",
            [
                (
                    "    while (p - 1) / (virtual_stages * m + p - 1) >= target:",
                    "    while (p - 1) / (m + p - 1) >= target:",
                )
            ],
        ),
        (
            "bubble of the ideal time, not of the step",
            [
                (
                    "    while (p - 1) / (virtual_stages * m + p - 1) >= target:",
                    "    while (p - 1) / (virtual_stages * m) >= target:",
                )
            ],
        ),
        (
            "stops at the target ('<=' instead of '<')",
            [
                (
                    "    while (p - 1) / (virtual_stages * m + p - 1) >= target:",
                    "    while (p - 1) / (virtual_stages * m + p - 1) > target:",
                )
            ],
        ),
        (
            "closed form without the + 1",
            [
                (
                    "    m = 1\n",
                    "    return max(1, int((p - 1) * (1 - target) / (target * virtual_stages)))\n    m = 1\n",
                )
            ],
        ),
        (
            "divides the whole v = 1 share by v",
            [
                (
                    "    while (p - 1) / (virtual_stages * m + p - 1) >= target:",
                    "    while (p - 1) / (virtual_stages * (m + p - 1)) >= target:",
                )
            ],
        ),
    ],
}
