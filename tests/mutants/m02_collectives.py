"""Wrong answers to notebook 02's exercises."""

ASSIGNMENT = "02-collectives"
RS_LOOP = "    for k in range(1, world_size):\n        outgoing"
AG_STEP = (
    "        request = dist.isend(chunks[(rank - k + 1) % world_size], dst=right)\n"
    "        dist.recv(chunks[(rank - k) % world_size], src=left)\n"
)

MUTANTS = {
    "ring-reduce-scatter": [
        (
            "torch's all-reduce",
            [(RS_LOOP, "    dist.all_reduce(tensor)\n    return chunks[rank]\n" + RS_LOOP)],
        ),
        (
            "distlab's ring",
            [
                (
                    RS_LOOP,
                    "    collectives.ring_all_reduce(tensor)\n    return chunks[rank]\n" + RS_LOOP,
                )
            ],
        ),
        (
            "torch's reduce_scatter_single (torch 2.13's name for reduce_scatter_tensor)",
            [
                (
                    RS_LOOP,
                    (
                        "    scatter = getattr(dist, 'reduce_scatter_single', None) or dist.reduce_scatter_tensor\n"
                        "    mine = torch.empty_like(chunks[rank])\n"
                        "    scatter(mine, tensor.clone())\n    chunks[rank].copy_(mine)\n    return chunks[rank]\n"
                        + RS_LOOP
                    ),
                )
            ],
        ),
        (
            "adds into the chunk it sends",
            [
                (
                    "        target = chunks[(rank - k - 1) % world_size]",
                    "        target = chunks[(rank - k) % world_size]",
                )
            ],
        ),
        (
            "steps k = 0 .. n-2",
            [("    for k in range(1, world_size):", "    for k in range(world_size - 1):")],
        ),
        (
            "receives straight into place, no adding",
            [
                ("        dist.recv(incoming, src=left)", "        dist.recv(target, src=left)"),
                ("        target += incoming", "        pass"),
            ],
        ),
        (
            "sends to the left",
            [
                (
                    "    right, left = (rank + 1) % world_size, (rank - 1) % world_size",
                    "    right, left = (rank - 1) % world_size, (rank + 1) % world_size",
                )
            ],
        ),
    ],
    "ring-all-gather": [
        (
            "torch's all-reduce of the tensor with zeros elsewhere",
            [
                (
                    "    right, left = (rank + 1)",
                    (
                        "    out = torch.zeros_like(tensor)\n"
                        "    torch.tensor_split(out, world_size)[rank].copy_(chunks[rank])\n"
                        "    dist.all_reduce(out)\n    tensor.copy_(out)\n    return\n    right, left = (rank + 1)"
                    ),
                )
            ],
        ),
        (
            "torch's all_gather_single (torch 2.13's name for all_gather_into_tensor)",
            [
                (
                    "    right, left = (rank + 1)",
                    (
                        "    gather = getattr(dist, 'all_gather_single', None) or dist.all_gather_into_tensor\n"
                        "    gather(tensor, chunks[rank].clone())\n    return\n    right, left = (rank + 1)"
                    ),
                )
            ],
        ),
        (
            "the reduce-scatter's chunk indices",
            [
                (
                    AG_STEP,
                    (
                        "        request = dist.isend(chunks[(rank - k) % world_size], dst=right)\n"
                        "        dist.recv(chunks[(rank - k - 1) % world_size], src=left)\n"
                    ),
                )
            ],
        ),
        (
            "one step short",
            [("    for k in range(1, world_size):", "    for k in range(1, world_size - 1):")],
        ),
        (
            "receives into a fresh buffer and never copies it",
            [
                (
                    "        dist.recv(chunks[(rank - k) % world_size], src=left)",
                    "        dist.recv(torch.empty_like(chunks[(rank - k) % world_size]), src=left)",
                )
            ],
        ),
    ],
    "ring-all-reduce": [
        (
            "torch's all-reduce",
            [
                (
                    "    ring_reduce_scatter(tensor, rank, world_size)\n    ring_all_gather(tensor, rank, world_size)",
                    "    dist.all_reduce(tensor)",
                )
            ],
        ),
        (
            "distlab's ring",
            [
                (
                    "    ring_reduce_scatter(tensor, rank, world_size)\n    ring_all_gather(tensor, rank, world_size)",
                    "    collectives.ring_all_reduce(tensor)",
                )
            ],
        ),
        (
            "the reduce-scatter only",
            [("    ring_all_gather(tensor, rank, world_size)", "    pass")],
        ),
        (
            "the phases in the wrong order",
            [
                (
                    "    ring_reduce_scatter(tensor, rank, world_size)\n    ring_all_gather(tensor, rank, world_size)",
                    "    ring_all_gather(tensor, rank, world_size)\n    ring_reduce_scatter(tensor, rank, world_size)",
                )
            ],
        ),
    ],
}
