"""The pipelined engine's dependency scan finds exactly the conflicts a plain pairwise scan finds.

No processes needed: the messages of one rank are built from the schedule and a tensor.
"""

from __future__ import annotations

import pytest
import torch

from distlab.collectives.buffers import Chunks
from distlab.collectives.pipelined import _overlap, segment_messages
from distlab.sim.algorithms import REGISTRY


def _pairwise(messages):
    """The O(M^2) reference: every earlier message of another step whose region overlaps."""
    return [
        {
            id(e)
            for e in messages[:i]
            if e.step != m.step
            and _overlap(e.region, m.region)
            and (m.kind == "recv" or e.kind == "recv")
        }
        for i, m in enumerate(messages)
    ]


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("n,segment_elems", [(3, 2), (4, 3), (5, 1000)])
def test_dependencies_equal_the_pairwise_scan(name, n, segment_elems):
    entry = REGISTRY[name]
    if entry.short == "hierarchical_shard" and n % 2:
        pytest.skip("the shard variant needs whole nodes of 2")
    schedule = entry.schedule(n, ranks_per_node=2)
    for rank in range(n):
        x = torch.zeros(61)
        if schedule.out_of_place:
            buffer = Chunks.of_list(list(x.tensor_split(schedule.n_chunks)))
            out = Chunks.of_list(list(torch.zeros(61).tensor_split(schedule.n_chunks)))
        else:
            buffer = out = Chunks.split(x, schedule.n_chunks)
        messages = segment_messages(schedule, rank, buffer, out, None, segment_elems)
        assert [{id(d) for d in m.after} for m in messages] == _pairwise(messages)
        if name == "ring_all_reduce":  # every step reads what the step before wrote
            assert sum(len(m.after) for m in messages) > 0
