"""Wrong answers to notebook 13's exercises."""

ASSIGNMENT = "13-sharded-matmuls-and-overlap"

_GATHER = "    gather_first = (n - 1) / n * j * k * bytes_per_element  # all-gather B (J x K)"
_FACTOR = "    reduce_factor = 1 if keep_sharded else 2  # reduce-scatter, or all-reduce"
_REDUCE = "    reduce_after = reduce_factor * (n - 1) / n * i * k * bytes_per_element  # C (I x K)"
_ALL_REDUCE = (
    '    if out == "C[I, K]":\n'
    "        total = c_partial.clone()\n"
    "        comm.all_reduce_sum_(total)\n"
    "        return total\n"
)
_MOVE = (
    "    blocks = c_partial.movedim(dim, 0).contiguous()  # the n blocks along dim, now flat blocks"
)
_BACK = "    return mine.movedim(0, dim).contiguous()"
_ONE = (
    "        return reduce if other_can_slice and reduce_cost < elements[split] "
    'else [("all_gather", split)]'
)
_SAME = '        return [("all_gather", "A" if out.axis_of(k) else "B")]'
_GATHER_C = '    return [("all_gather", "C" if elements["C"] < elements[operand] else operand)]'

MUTANTS = {
    "gather-or-reduce": [
        (
            "copies case 2's formula: gathers A (I J), the operand that is whole here",
            [(_GATHER, "    gather_first = (n - 1) / n * i * j * bytes_per_element")],
        ),
        (
            "reduce after is always an all-reduce",
            [(_FACTOR, "    reduce_factor = 2")],
        ),
        (
            "no (n-1)/n: the whole buffer per rank",
            [
                (_GATHER, _GATHER.replace("(n - 1) / n * ", "")),
                (_REDUCE, _REDUCE.replace("(n - 1) / n * ", "")),
            ],
        ),
        (
            "gather first counts the block a rank already holds (J K / n)",
            [(_GATHER, "    gather_first = (n - 1) / n * j * k / n * bytes_per_element")],
        ),
        (
            "reduce after sends the weight's size (J K), not C's",
            [
                (
                    _REDUCE,
                    "    reduce_after = reduce_factor * (n - 1) / n * j * k * bytes_per_element",
                )
            ],
        ),
        (
            "gather first counted as an all-reduce (twice the bytes)",
            [(_GATHER, "    gather_first = 2 * (n - 1) / n * j * k * bytes_per_element")],
        ),
        (
            "calls the library's CommPart",
            [
                (
                    _GATHER,
                    (
                        '    gather_first = CommPart("B", "all_gather", n, j * k * bytes_per_element)'
                        ".bytes_sent"
                    ),
                )
            ],
        ),
    ],
    "reduce-partial-sums": [
        (
            "all-reduces, then keeps its block (twice the bytes)",
            [
                (
                    _MOVE,
                    "    total = c_partial.clone()\n"
                    "    comm.all_reduce_sum_(total)\n"
                    "    return total.chunk(comm.world_size, dim)[comm.rank].contiguous()\n"
                    + _MOVE,
                )
            ],
        ),
        (
            "reduce-scatters the flat memory without moving the dimension (columns wrong)",
            [
                (_MOVE, "    blocks = c_partial.contiguous()"),
                (_BACK, "    return mine"),
                (
                    "    mine = blocks.new_empty((blocks.shape[0] // comm.world_size, *blocks.shape[1:]))",
                    (
                        "    shape = list(blocks.shape)\n"
                        "    shape[dim] //= comm.world_size\n"
                        "    mine = blocks.new_empty(shape)"
                    ),
                ),
            ],
        ),
        (
            "rows and columns swapped",
            [
                (
                    '    dim = 0 if out == "C[I_x, K]" else 1',
                    '    dim = 1 if out == "C[I_x, K]" else 0',
                )
            ],
        ),
        (
            "torch.distributed's own all-reduce (bytes not counted, and twice a reduce-scatter's)",
            [
                (
                    _MOVE,
                    "    import torch.distributed as dist\n"
                    "    total = c_partial.clone()\n"
                    "    dist.all_reduce(total)\n"
                    "    return total.chunk(comm.world_size, dim)[comm.rank].contiguous()\n"
                    + _MOVE,
                )
            ],
        ),
        (
            "calls the library's reduce-scatter along a dimension",
            [
                (
                    _MOVE,
                    '    return tp_ops.reduce_scatter(c_partial, dim, comm, "forward", "C")\n'
                    + _MOVE,
                )
            ],
        ),
        (
            "forgets to sum: returns its own partial sum's block",
            [(_ALL_REDUCE, '    if out == "C[I, K]":\n        return c_partial\n')],
        ),
    ],
    "choose-communication": [
        (
            "always gathers the operand split along J (never reduces after)",
            [(_ONE, '        return [("all_gather", split)]')],
        ),
        (
            "always all-reduces partial sums, even when C may stay split",
            [
                (
                    '    reduce = [("reduce_scatter", "C")] if c_split else [("all_reduce", "C")]',
                    '    reduce = [("all_reduce", "C")]',
                )
            ],
        ),
        (
            "compares I K with I J, forgetting that an all-reduce sends twice",
            [
                (
                    '    reduce_cost = elements["C"] * (1 if c_split else 2)',
                    '    reduce_cost = elements["C"]',
                )
            ],
        ),
        (
            "gathers the operand whose dimension the output wants whole, the wrong one",
            [(_SAME, '        return [("all_gather", "B" if out.axis_of(k) else "A")]')],
        ),
        (
            "gathers the split operand, never the smaller result",
            [(_GATHER_C, '    return [("all_gather", operand)]')],
        ),
        (
            "calls the library's best plan",
            [
                (
                    "    a, b, out = sharding.sharded(a), sharding.sharded(b), sharding.sharded(out)",
                    "    return sharding.best_plan(a, b, sizes, MESH, out=out).communication",
                )
            ],
        ),
    ],
}

ALTERNATIVES = {
    "choose-communication": [
        (
            "a whole C's all-reduce as a reduce-scatter and an all-gather (the same bytes)",
            [
                (
                    '    reduce = [("reduce_scatter", "C")] if c_split else [("all_reduce", "C")]',
                    '    reduce = [("reduce_scatter", "C")] + ([] if c_split else [("all_gather", "C")])',
                )
            ],
        ),
    ],
}
