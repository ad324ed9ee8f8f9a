"""Wrong answers to notebook 04's exercises."""

ASSIGNMENT = "04-data-parallelism"

MUTANTS = {
    "assign-buckets": [
        (
            "distlab's assignment as a default argument",
            [
                (
                    "def assign_buckets(params: list[nn.Parameter], cap_bytes: float) -> list[list[nn.Parameter]]:",
                    "def assign_buckets(params, cap_bytes, _ref=reference_buckets.assign_buckets):",
                ),
                (
                    "    buckets, current, size = [], [], 0",
                    "    return _ref(list(reversed(params)), cap_bytes)\n    buckets, current, size = [], [], 0",
                ),
            ],
        ),
        (
            "a copy of distlab's code (inspect.getsource and exec)",
            [
                (
                    "def assign_buckets(",
                    ("import inspect\n\ncopied = dict(vars(reference_buckets))\n"
                    "exec(inspect.getsource(reference_buckets.assign_buckets), copied)\n\n\n"
                    "def assign_buckets("),
                ),
                (
                    "    buckets, current, size = [], [], 0",
                    ("    return copied['assign_buckets'](list(reversed(params)), cap_bytes)\n"
                    "    buckets, current, size = [], [], 0"),
                ),
            ],
        ),
        (
            "distlab's module reloaded, so its function is a new object",
            [
                (
                    "def assign_buckets(",
                    ("import importlib\n\nfresh = importlib.reload(reference_buckets)\n\n\n"
                    "def assign_buckets("),
                ),
                (
                    "    buckets, current, size = [], [], 0",
                    ("    return fresh.assign_buckets(list(reversed(params)), cap_bytes)\n"
                    "    buckets, current, size = [], [], 0"),
                ),
            ],
        ),
        (
            "calls PyTorch's assignment",
            [
                (
                    "    buckets, current, size = [], [], 0",
                    (
                        "    order = list(reversed(params))\n"
                        "    found, _ = dist._compute_bucket_assignment_by_size(order, [int(cap_bytes)])\n"
                        "    return [[order[i] for i in b] for b in found]\n"
                        "    buckets, current, size = [], [], 0"
                    ),
                )
            ],
        ),
        (
            "calls distlab's assignment",
            [
                (
                    "    buckets, current, size = [], [], 0",
                    (
                        "    return reference_buckets.assign_buckets(list(reversed(params)), cap_bytes)\n"
                        "    buckets, current, size = [], [], 0"
                    ),
                )
            ],
        ),
        ("forward order", [("    for p in reversed(params):", "    for p in params:")]),
        (
            "closes a bucket only above the cap",
            [("        if size >= cap_bytes:", "        if size > cap_bytes:")],
        ),
        (
            "counts elements, not bytes",
            [("        size += p.numel() * p.element_size()", "        size += p.numel()")],
        ),
        (
            "drops the last, partial bucket",
            [("    if current:\n        buckets.append(current)\n", "")],
        ),
    ],
    "bucket-ddp": [
        (
            "launches every bucket only at the end of backward (no overlap)",
            [
                (
                    "            ready.work = dist.all_reduce(ready.flat, async_op=True)\n",
                    "            ready.work = None  # launched in _finish\n",
                ),
                (
                    "        for bucket in self.buckets:\n            bucket.work.wait()",
                    (
                        "        for bucket in self.buckets:\n"
                        "            bucket.work = dist.all_reduce(bucket.flat, async_op=True)\n"
                        "        for bucket in self.buckets:\n            bucket.work.wait()"
                    ),
                ),
            ],
        ),
        ("sums instead of averaging", [("            bucket.flat.div_(self.world_size)\n", "")]),
        (
            "all-reduces after every gradient, not per bucket",
            [
                (
                    "        bucket.pending -= 1\n",
                    "        bucket.pending -= 1\n        dist.all_reduce(param.grad)\n",
                )
            ],
        ),
        (
            "never writes the averaged gradients back",
            [
                (
                    "            for p in bucket.params:\n                p.grad.copy_(bucket.slices[p])\n",
                    "",
                )
            ],
        ),
    ],
    "ddp-equality": [
        (
            "compares rank 0 only",
            [
                (
                    "    return max(max_difference(params, reference) for params in per_rank)",
                    "    return max_difference(per_rank[0], reference)",
                )
            ],
        ),
        (
            "every rank trains on the whole batch",
            [
                (
                    "        share = parallel.shard_batch(mlp_batch(GLOBAL_BATCH, seed=step), rank, world_size)",
                    "        share = mlp_batch(GLOBAL_BATCH, seed=step)",
                )
            ],
        ),
        (
            "the same data every step",
            [("mlp_batch(GLOBAL_BATCH, seed=step)", "mlp_batch(GLOBAL_BATCH, seed=0)")],
        ),
    ],
    "accumulate": [
        (
            "does not divide the loss by the number of micro-batches",
            [
                (
                    "                (loss / k).backward()\n        else:",
                    "                loss.backward()\n        else:",
                ),
                (
                    "            (loss / k).backward()\n        total",
                    "            loss.backward()\n        total",
                ),
            ],
        ),
        (
            "communicates in every backward (no no_sync)",
            [('        if hasattr(model, "no_sync") and not last:', "        if False:")],
        ),
        (
            "skips communication in the last backward too",
            [
                (
                    '        if hasattr(model, "no_sync") and not last:',
                    '        if hasattr(model, "no_sync"):',
                )
            ],
        ),
    ],
    "large-batch-lr": [
        (
            "ignores accumulation in the batch",
            [("    batch = local_batch * ranks * accumulation", "    batch = local_batch * ranks")],
        ),
        (
            "warmup counts from step 1",
            [
                (
                    "    return base_lr + (target - base_lr) * step / warmup_steps",
                    "    return base_lr + (target - base_lr) * (step + 1) / warmup_steps",
                )
            ],
        ),
        (
            "warmup from zero, not from the base rate",
            [
                (
                    "    return base_lr + (target - base_lr) * step / warmup_steps",
                    "    return target * step / warmup_steps",
                )
            ],
        ),
        (
            "square-root scaling",
            [
                (
                    "    target = base_lr * batch / base_batch",
                    "    target = base_lr * (batch / base_batch) ** 0.5",
                )
            ],
        ),
    ],
}
