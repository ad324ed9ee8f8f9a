"""Wrong answers to notebook 09's exercises."""

ASSIGNMENT = "09-3d-parallelism-and-placement"

_RANK = "        return t + tp * (d + dp * p)"
_RETURN_PLACE = "    return sorted(chosen[: layout.world_size])"
_CANDIDATES = "    candidates = [\n"

MUTANTS = {
    "rank-groups": [
        (
            "the library's rank_groups as a default argument",
            [
                (
                    "def megatron_groups(world_size: int, tp: int, pp: int) -> dict[str, list[list[int]]]:",
                    "def megatron_groups(world_size, tp, pp, _groups=rank_groups):",
                ),
                (
                    "    dp = world_size // (tp * pp)\n",
                    (
                        "    dp = world_size // (tp * pp)\n"
                        "    return _groups(world_size, tp=tp, pp=pp, dp=dp)\n"
                    ),
                ),
            ],
        ),
        (
            "calls the library's rank_groups",
            [
                (
                    "    dp = world_size // (tp * pp)\n",
                    (
                        "    dp = world_size // (tp * pp)\n"
                        "    return rank_groups(world_size, tp=tp, pp=pp, dp=dp)\n"
                    ),
                )
            ],
        ),
        (
            "builds a Layout",
            [
                (
                    "    dp = world_size // (tp * pp)\n",
                    (
                        "    dp = world_size // (tp * pp)\n"
                        "    mesh = Layout.for_world(world_size, tp=tp, pp=pp)\n"
                        "    return {name: mesh.groups[name] for name in ('tp', 'dp', 'pp')}\n"
                    ),
                )
            ],
        ),
        ("the 'TP, PP, DP' order", [(_RANK, "        return t + tp * (p + pp * d)")]),
        ("DP fastest, then TP", [(_RANK, "        return d + dp * (t + tp * p)")]),
        (
            "DP groups listed with the slower coordinate varying fastest",
            [
                (
                    '        "dp": [[rank(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)],',
                    '        "dp": [[rank(t, d, p) for d in range(dp)] for t in range(tp) for p in range(pp)],',
                )
            ],
        ),
        (
            "forgets pp in dp",
            [("    dp = world_size // (tp * pp)\n", "    dp = world_size // tp\n")],
        ),
        (
            "never raises ValueError",
            [
                (
                    '        raise ValueError(f"tp={tp} x pp={pp} must divide world_size={world_size}")',
                    "        pass",
                )
            ],
        ),
        (
            "a ValueError that names no value",
            [
                (
                    '        raise ValueError(f"tp={tp} x pp={pp} must divide world_size={world_size}")',
                    '        raise ValueError("tp x pp must divide the world size")',
                )
            ],
        ),
    ],
    "place-job": [
        (
            "calls the library's place",
            [
                (
                    "    per_node = {}\n",
                    (
                        "    return [int(g) for g in place(layout, cluster, gpus=free_gpus).gpu_of_rank]\n"
                        "    per_node = {}\n"
                    ),
                )
            ],
        ),
        (
            "the naive placement: the first free GPUs",
            [(_RETURN_PLACE, "    return sorted(free_gpus)[: layout.world_size]")],
        ),
        (
            "emptiest nodes first",
            [
                (
                    "    for node in sorted(usable, key=lambda n: (-len(usable[n]), n)):",
                    "    for node in sorted(usable, key=lambda n: (len(usable[n]), n)):",
                )
            ],
        ),
        (
            "partial TP groups kept",
            [
                (
                    "        usable = {node: gpus[: len(gpus) // unit * unit] for node, gpus in per_node.items()}",
                    "        usable = dict(per_node)",
                )
            ],
        ),
        (
            "whole TP groups on the fullest nodes, but a stage's DP group may straddle two nodes",
            [
                (
                    "    for unit in (layout.tp * layout.dp, layout.tp):",
                    "    for unit in (layout.tp,):",
                )
            ],
        ),
        (
            "whole DP groups per node, but the nodes taken in id order, not the fullest first",
            [
                (
                    "        for node in sorted(usable, key=lambda n: (-len(usable[n]), n)):",
                    "        for node in sorted(usable):",
                )
            ],
        ),
        (
            "the visible case hard-coded (nodes 1 and 3)",
            [(_RETURN_PLACE, "    return list(range(8, 16)) + list(range(24, 32))")],
        ),
    ],
    "queue-order": [
        (
            "as submitted (first in, first out)",
            [(_CANDIDATES, "    return [j.name for j in jobs]\n" + _CANDIDATES)],
        ),
        (
            "shortest first",
            [(_CANDIDATES, "    return ordered(lambda j: j.duration_s)\n" + _CANDIDATES)],
        ),
        (
            "longest first",
            [(_CANDIDATES, "    return ordered(lambda j: -j.duration_s)\n" + _CANDIDATES)],
        ),
        (
            "the order reversed (last entry taken as first)",
            [
                (
                    "    return min(candidates, key=outcome)",
                    "    return list(reversed(min(candidates, key=outcome)))",
                )
            ],
        ),
        (
            "the visible mix hard-coded",
            [
                (
                    _CANDIDATES,
                    "    return ['eval-2', 'eval-1', 'finetune-a', 'mid', 'sweep-1', 'sweep-2', "
                    "'finetune-b', 'pretrain']\n" + _CANDIDATES,
                )
            ],
        ),
    ],
}
