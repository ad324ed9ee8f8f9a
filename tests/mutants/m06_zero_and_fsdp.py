"""Wrong answers to notebook 06's exercises."""

ASSIGNMENT = "06-zero-and-fsdp"

_ACCUMULATE = (
    "        if shard.grad is None:\n"
    "            shard.grad = mine\n"
    "        else:\n"
    "            shard.grad.add_(mine)\n"
)
_STEP = (
    "        self.optimizer.step()\n"
    "        for group, flat, shard in self.buckets.values():\n"
    "            ring_all_gather(flat, shard.detach().clone())\n"
)

MUTANTS = {
    "zero2": [
        ("sums the gradients instead of averaging", [("        mine.div_(self.world_size)\n", "")]),
        (
            "replaces the gradient shard at each micro-batch instead of accumulating",
            [(_ACCUMULATE, "        shard.grad = mine\n")],
        ),
        ("keeps the full gradient after the reduce-scatter", [("        param.grad = None\n", "")]),
        (
            "all-reduces the whole gradient, then keeps this rank's slice",
            [
                (
                    (
                        "        mine = torch.empty(group.shard_numel, dtype=param.dtype)\n"
                        '        ring_reduce_scatter(mine, group.flatten([param.grad]), "sum")\n'
                    ),
                    (
                        "        full = group.flatten([param.grad])\n"
                        "        ring_all_reduce(full)\n"
                        "        mine = group.shard_of(full).clone()\n"
                    ),
                )
            ],
        ),
        (
            "all-gathers before the optimizer step (the weights lag one step)",
            [
                (
                    _STEP,
                    (
                        "        for group, flat, shard in self.buckets.values():\n"
                        "            ring_all_gather(flat, shard.detach().clone())\n"
                        "        self.optimizer.step()\n"
                    ),
                )
            ],
        ),
        (
            "never all-gathers: each rank updates only its own shard of the weights",
            [(_STEP, "        self.optimizer.step()\n")],
        ),
    ],
    "sharded-linear": [
        (
            "keeps the unit gathered from forward to backward",
            [
                (
                    "        y = F.linear(x, unit.weight, unit.bias)\n        unit.free()\n",
                    "        y = F.linear(x, unit.weight, unit.bias)\n",
                ),
                (
                    "        unit.gather()\n        grad_x = grad_y @ unit.weight\n",
                    "        grad_x = grad_y @ unit.weight\n",
                ),
            ],
        ),
        (
            "the weight gradient transposed (x^T dL/dy)",
            [("unit.reduce_scatter(grad_y.T @ x, ", "unit.reduce_scatter(x.T @ grad_y, ")],
        ),
        (
            "the bias gradient averaged over the batch instead of summed",
            [("grad_y.sum(0))", "grad_y.mean(0))")],
        ),
        (
            "keeps the local gradient's shard without reduce-scattering it",
            [
                (
                    "        grad_shard = unit.reduce_scatter(grad_y.T @ x, grad_y.sum(0))\n",
                    (
                        "        grad_shard = unit.group.shard_of(\n"
                        "            unit.group.flatten([grad_y.T @ x, grad_y.sum(0)])).clone()\n"
                    ),
                )
            ],
        ),
        (
            "forgets to free the unit after backward",
            [("        unit.free()\n        return grad_x", "        return grad_x")],
        ),
    ],
}
