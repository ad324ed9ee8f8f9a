"""Wrong answers to notebook 03's exercises."""

ASSIGNMENT = "03-algorithms-and-cost"
RING = "    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * n_bytes * link.beta"

MUTANTS = {
    "ring-all-reduce-time": [
        ("no latency term", [(RING, "    return 2 * (n - 1) / n * n_bytes * link.beta")]),
        (
            "half the steps (a reduce-scatter only)",
            [(RING, "    return (n - 1) * link.alpha + (n - 1) / n * n_bytes * link.beta")],
        ),
        (
            "the whole buffer every step, not N/n",
            [(RING, "    return 2 * (n - 1) * link.alpha + 2 * (n - 1) * n_bytes * link.beta")],
        ),
        (
            "calls the reference",
            [(RING, '    return sim.closed_form("ring_all_reduce", n).time(n_bytes, link)')],
        ),
        (
            "the visible case hard-coded (n = 8)",
            [(RING, "    return 0.0 if n == 1 else 14 * link.alpha + 1.75 * n_bytes * link.beta")],
        ),
    ],
    "tree-ring-crossover": [
        (
            "calls the reference",
            [
                (
                    "    rounds = math.ceil",
                    "    return sim.crossover_size(n, link)\n    rounds = math.ceil",
                )
            ],
        ),
        ("log2 without ceil", [("math.ceil(math.log2(n))", "math.log2(n)")]),
        (
            "no check for 'the tree never wins'",
            [("    if latency_saved <= 0 or extra_per_byte <= 0:\n        return 0.0\n", "")],
        ),
        (
            "the ratio upside down",
            [
                (
                    "    return latency_saved / extra_per_byte",
                    "    return extra_per_byte / latency_saved",
                )
            ],
        ),
    ],
    "bandwidths": [
        (
            "the references as default arguments",
            [
                (
                    "def bandwidths(collective: str, n: int, n_bytes: float, time_s: float) -> tuple[float, float]:",
                    "def bandwidths(collective, n, n_bytes, time_s, _algbw=sim.algbw, _busbw=sim.busbw):",
                ),
                (
                    "    algbw = n_bytes / time_s\n",
                    ("    return _algbw(n_bytes, time_s), _busbw(collective, n, n_bytes, time_s)\n"
                    "    algbw = n_bytes / time_s\n"),
                ),
            ],
        ),
        (
            "the references in a dict built at cell level",
            [
                (
                    "def bandwidths(",
                    "REFERENCES = {'algbw': sim.algbw, 'busbw': sim.busbw}\n\n\ndef bandwidths(",
                ),
                (
                    "    algbw = n_bytes / time_s\n",
                    ("    algbw = REFERENCES['algbw'](n_bytes, time_s)\n"
                    "    return algbw, REFERENCES['busbw'](collective, n, n_bytes, time_s)\n"),
                ),
            ],
        ),
        (
            "functools.partial of the reference",
            [
                (
                    "def bandwidths(",
                    "import functools\n\nbusbw_of = functools.partial(sim.busbw)\n\n\ndef bandwidths(",
                ),
                (
                    "    return algbw, algbw * factor",
                    "    return algbw, busbw_of(collective, n, n_bytes, time_s)",
                ),
            ],
        ),
        (
            "calls the reference",
            [
                (
                    "    return algbw, algbw * factor",
                    "    return sim.algbw(n_bytes, time_s), sim.busbw(collective, n, n_bytes, time_s)",
                )
            ],
        ),
        (
            "all-reduce factor without the 2",
            [("        factor = 2 * (n - 1) / n", "        factor = (n - 1) / n")],
        ),
        (
            "broadcast counted like all-gather",
            [
                (
                    '    elif collective in ("reduce_scatter", "all_gather", "all_to_all"):',
                    '    elif collective in ("reduce_scatter", "all_gather", "all_to_all", "broadcast"):',
                )
            ],
        ),
        (
            "algbw from the bytes of all ranks",
            [("    algbw = n_bytes / time_s", "    algbw = n * n_bytes / time_s")],
        ),
    ],
    "fit-two-sizes": [
        (
            "calls the library's least squares",
            [
                (
                    "    det = s1 * b2 - s2 * b1",
                    (
                        "    found = fit.fit_alpha_beta([small, large])\n    return found.alpha, found.beta\n"
                        "    det = s1 * b2 - s2 * b1"
                    ),
                )
            ],
        ),
        (
            "alpha and beta swapped",
            [
                (
                    "    return (t1 * b2 - t2 * b1) / det, (s1 * t2 - s2 * t1) / det",
                    "    return (s1 * t2 - s2 * t1) / det, (t1 * b2 - t2 * b1) / det",
                )
            ],
        ),
        (
            "ignores the latency steps: alpha is the small run's time",
            [("    det = s1 * b2 - s2 * b1", "    return t1, (t2 - t1) / (b2 - b1)\n    det = 1")],
        ),
    ],
    "two-level-all-reduce": [
        (
            "one flat ring over every rank (right sum, wrong traffic)",
            [
                (
                    "    k = dist.get_world_size(node_group)",
                    "    ring_all_reduce(tensor)\n    return\n    k = dist.get_world_size(node_group)",
                )
            ],
        ),
        (
            "all-reduce inside the node, then across (sends the whole buffer across)",
            [
                (
                    (
                        "    ring_reduce_scatter(shard, tensor, group=node_group)\n"
                        "    ring_all_reduce(shard, group=cross_group)\n"
                        "    ring_all_gather(tensor, shard, group=node_group)"
                    ),
                    (
                        "    ring_all_reduce(tensor, group=node_group)\n"
                        "    ring_all_reduce(tensor, group=cross_group)"
                    ),
                )
            ],
        ),
        (
            "forgets the all-gather",
            [
                (
                    "    ring_all_gather(tensor, shard, group=node_group)",
                    "    tensor[: shard.numel()].copy_(shard)",
                )
            ],
        ),
    ],
}
