"""Wrong answers to notebook 07's exercises."""

ASSIGNMENT = "07-tensor-and-sequence-parallelism"

_COLUMN = '    return F.linear(copy_to_tp(x, comm, "column in"), weight, bias)'
_ROW = (
    '    y = reduce_from_tp(F.linear(x_shard, weight), comm, "row out")\n'
    "    return y if bias is None else y + bias"
)
_MLP_OUT = '    return reduce_from_tp(F.linear(hidden, fc2_weight), comm, "mlp out") + fc2_bias'
_TRAFFIC = "    return calls, calls * 2 * (tp - 1) / tp * payload"
_SP_IN = '    x = sp.gather_from_sp(x_shard, comm, "mlp in")'
_SP_OUT = (
    '    return sp.reduce_scatter_to_sp(F.linear(hidden, fc2_weight), comm, "mlp.fc2 out")'
    " + fc2_bias"
)

MUTANTS = {
    "tp-linears": [
        (
            "column layer without f: dL/dX stays this rank's partial sum",
            [(_COLUMN, "    return F.linear(x, weight, bias)")],
        ),
        (
            "row layer adds the bias before the all-reduce (t copies of it)",
            [(_ROW, '    return reduce_from_tp(F.linear(x_shard, weight, bias), comm, "row out")')],
        ),
        (
            "row layer uses f instead of g (no forward all-reduce)",
            [(_ROW, _ROW.replace("reduce_from_tp", "copy_to_tp"))],
        ),
        (
            "column layer all-reduces its output instead of its input gradient",
            [(_COLUMN, '    return reduce_from_tp(F.linear(x, weight, bias), comm, "column out")')],
        ),
        (
            "calls distlab's RowParallelLinear.forward",
            [
                (
                    _ROW,
                    (
                        "    import types\n"
                        "    layer = types.SimpleNamespace(weight=weight, bias=bias, comm=comm,\n"
                        '                                  sequence_parallel=False, name="row")\n'
                        "    return tp_layers.RowParallelLinear.forward(layer, x_shard)"
                    ),
                )
            ],
        ),
    ],
    "parallel-mlp": [
        (
            "adds fc2's bias before the all-reduce (t copies of it)",
            [
                (
                    _MLP_OUT,
                    '    return reduce_from_tp(F.linear(hidden, fc2_weight, fc2_bias), comm, "mlp out")',
                )
            ],
        ),
        (
            "no f before fc1: dL/dx stays this rank's partial sum",
            [
                (
                    'F.linear(copy_to_tp(x, comm, "mlp in"), fc1_weight, fc1_bias)',
                    "F.linear(x, fc1_weight, fc1_bias)",
                )
            ],
        ),
        ("ReLU instead of GeLU", [("hidden = F.gelu(", "hidden = F.relu(")]),
        (
            "all-reduces after fc1 as well (sums the column shards)",
            [
                (
                    'hidden = F.gelu(F.linear(copy_to_tp(x, comm, "mlp in"), fc1_weight, fc1_bias))',
                    (
                        'hidden = F.gelu(reduce_from_tp(F.linear(copy_to_tp(x, comm, "mlp in"), '
                        'fc1_weight, fc1_bias), comm, "mlp mid"))'
                    ),
                )
            ],
        ),
    ],
    "tp-step-traffic": [
        (
            "no ring factor: sends the payload once per all-reduce",
            [(_TRAFFIC, "    return calls, calls * payload")],
        ),
        (
            "ring factor (t-1)/t of a reduce-scatter alone",
            [(_TRAFFIC, "    return calls, calls * (tp - 1) / tp * payload")],
        ),
        (
            "counts the forward's all-reduces only",
            [("    calls = 4 * layers * micro_batches", "    calls = 2 * layers * micro_batches")],
        ),
        (
            "forgets the micro-batches",
            [("    calls = 4 * layers * micro_batches", "    calls = 4 * layers")],
        ),
        (
            "calls distlab.calc's tensor_parallel_comm",
            [
                (
                    _TRAFFIC,
                    (
                        "    v = calc_comm.tensor_parallel_comm(seq_len=seq_len, micro_batch=micro_batch,\n"
                        "        hidden=hidden, layers=layers, tp=tp, micro_batches=micro_batches,\n"
                        "        bytes_per_element=bytes_per_element)\n"
                        "    return sum(p.count for p in v.parts), v.total"
                    ),
                )
            ],
        ),
        (
            "hard-codes t = 2 in the ring factor",
            [(_TRAFFIC, "    return calls, calls * 2 * (2 - 1) / 2 * payload")],
        ),
    ],
    "sp-region": [
        (
            "adds fc2's bias before the reduce-scatter (t copies of it)",
            [
                (
                    _SP_OUT,
                    (
                        "    return sp.reduce_scatter_to_sp(F.linear(hidden, fc2_weight, fc2_bias), comm,"
                        ' "mlp.fc2 out")'
                    ),
                )
            ],
        ),
        (
            "all-reduces, then keeps this rank's tokens (correct values, wrong collectives)",
            [
                (
                    _SP_OUT,
                    (
                        '    z = reduce_from_tp(F.linear(hidden, fc2_weight), comm, "mlp.fc2 out")\n'
                        '    return sp.scatter_to_sp(z, comm, "mlp out") + fc2_bias'
                    ),
                )
            ],
        ),
        (
            "plain tensor parallelism: f instead of the all-gather (each rank sees its tokens only)",
            [(_SP_IN, '    x = copy_to_tp(x_shard, comm, "mlp in")')],
        ),
        (
            "returns the whole sequence (all-reduce instead of reduce-scatter)",
            [
                (
                    _SP_OUT,
                    (
                        '    return reduce_from_tp(F.linear(hidden, fc2_weight), comm, "mlp.fc2 out")'
                        " + fc2_bias"
                    ),
                )
            ],
        ),
    ],
}
