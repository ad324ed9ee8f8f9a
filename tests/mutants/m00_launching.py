"""Wrong answers to notebook 00's exercises."""

ASSIGNMENT = "00-launching"
PADDING = "    while len(order) < total:\n        order += order[: total - len(order)]\n"

MUTANTS = {
    "pass-token": [
        (
            "gathers every rank's value with a built-in collective",
            [
                (
                    "    right, left = (rank + 1) % world_size, (rank - 1) % world_size\n",
                    (
                        "    values = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]\n"
                        "    dist.all_gather(values, torch.tensor([rank + 1]))\n"
                        "    total = [int(v) for v in values]\n"
                        "    return sum(total) if rank == 0 else sum(total[:rank])\n"
                        "    right, left = (rank + 1) % world_size, (rank - 1) % world_size\n"
                    ),
                )
            ],
        ),
        (
            "gathers with all_gather_single (torch 2.13's name, not the deprecated one)",
            [
                (
                    "    right, left = (rank + 1) % world_size, (rank - 1) % world_size\n",
                    (
                        "    gather = getattr(dist, 'all_gather_single', None) or dist.all_gather_into_tensor\n"
                        "    values = torch.zeros(world_size, dtype=torch.int64)\n"
                        "    gather(values, torch.tensor([rank + 1]))\n"
                        "    total = [int(v) for v in values]\n"
                        "    return sum(total) if rank == 0 else sum(total[:rank])\n"
                        "    right, left = (rank + 1) % world_size, (rank - 1) % world_size\n"
                    ),
                )
            ],
        ),
        (
            "computes the token by formula, sends nothing",
            [
                (
                    "    right, left = (rank + 1) % world_size, (rank - 1) % world_size\n",
                    (
                        "    return world_size * (world_size + 1) // 2 if rank == 0 else rank * (rank + 1) // 2\n"
                        "    right, left = (rank + 1) % world_size, (rank - 1) % world_size\n"
                    ),
                )
            ],
        ),
        ("adds the rank, not rank + 1", [("    token += rank + 1\n", "    token += rank\n")]),
        (
            "returns the token after adding its own value",
            [("    token += rank + 1\n    dist.send(token, dst=right)\n    return received",
              "    token += rank + 1\n    dist.send(token, dst=right)\n    return int(token)")],
        ),
        ("one rank returns its rank", [("    if world_size == 1:\n        return rank + 1", "    if world_size == 1:\n        return rank")]),
    ],
    "shard-indices": [
        (
            "asks DistributedSampler",
            [
                (
                    "    if shuffle:\n        generator",
                    (
                        "    from torch.utils.data import DistributedSampler as Sampler\n"
                        "    sampler = Sampler(range(dataset_len), num_replicas=world_size, rank=rank,\n"
                        "                      shuffle=shuffle, seed=seed)\n"
                        "    sampler.set_epoch(epoch)\n"
                        "    return list(sampler)\n"
                        "    if shuffle:\n        generator"
                    ),
                )
            ],
        ),
        ("ignores the epoch", [("        generator.manual_seed(seed + epoch)", "        generator.manual_seed(seed)")]),
        ("no padding", [(PADDING, "")]),
        (
            "contiguous blocks instead of every world_size-th index",
            [("    return order[rank:total:world_size]",
              "    per_rank = total // world_size\n    return order[rank * per_rank:(rank + 1) * per_rank]")],
        ),
        (
            "pads with 0, 1, 2, ... instead of repeating the order",
            [(PADDING, "    order += list(range(total - len(order)))\n")],
        ),
        (
            "pads only once",
            [(PADDING, "    order += order[: total - len(order)]\n")],
        ),
    ],
}
