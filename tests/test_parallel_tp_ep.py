"""TP=2 x EP=2 x DP=2: the MoE GPT on 8 gloo processes equals one process.

World 8 = tp 2 x dp 4; the MoE layers re-split dp 4 into ep 2 x expert_dp 2.
One launch trains ``MoEGPT(CONFIG, MOE)`` (block 0 dense, block 1 MoE with 4
experts, top-2, capacity factor 1) for ``STEPS`` SGD steps. The reference is
the same model in one process on the whole batch, routing it in dp = 4
groups (the replicas' batches; capacity is per group). Losses must match
(rtol 1e-5: partial sums add in another order), every rank's final
parameters must equal its slice (TP shard, its experts) of the reference,
tokens must really be dropped as the capacity formula says, and the
all-to-all bytes must equal :func:`distlab.calc.moe.moe_all_to_all_comm`.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.calc.moe import expert_capacity, moe_all_to_all_comm
from distlab.models import GPTConfig, gpt_batch
from distlab.parallel.moe.gpt import MoEConfig

CONFIG = GPTConfig(vocab=30, seq_len=8, hidden=16, heads=4, layers=2)
MOE = MoEConfig(num_experts=4, top_k=2, capacity_factor=1.0, every=2, ffn_hidden=24)
TP, EP, DP, STEPS, LR, AUX, BATCH = 2, 2, 4, 20, 0.2, 0.01, 8
TOKENS_PER_RANK = BATCH // DP * CONFIG.seq_len


def _train(rank, world_size, tp, ep, dp, config, moe, bad_rank=None):
    torch.set_num_threads(1)
    from distlab.core.layout import Layout
    from distlab.parallel.compose import train
    from distlab.parallel.moe.gpt import MoEGPT

    tokens, targets = gpt_batch(6 if rank == bad_rank else BATCH, config, seed=1)
    model = MoEGPT(config, moe, seed=0)
    layout = Layout(tp=tp, ep=ep, dp=dp)
    return train(model, layout, tokens, targets, steps=STEPS, lr=LR, aux_weight=AUX)


def _single_process():
    """The dense model on the whole batch, routed in dp groups; its losses and drops."""
    from distlab.parallel.moe.gpt import MoEGPT, aux_loss, moe_layers

    model = MoEGPT(CONFIG, MOE, seed=0, routing_groups=DP)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    losses, dropped = [], []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(tokens, targets) + AUX * aux_loss(model)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        dropped.append([[r.dropped for r in layer.routings] for layer in moe_layers(model)])
    return model, losses, dropped


@pytest.fixture(scope="module")
def runs():
    return distlab.run(_train, TP * DP, args=(TP, EP, DP, CONFIG, MOE), timeout=180)


@pytest.fixture(scope="module")
def reference():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: more threads only fight over the cores
    try:
        return _single_process()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_losses_equal_single_process(runs, reference):
    from distlab.core.layout import Layout

    _, want, _ = reference
    assert want[-1] < want[0]  # it really trains
    layout = Layout.for_world(TP * DP, tp=TP, ep=EP)
    for run in runs:
        assert run.coordinates == layout.coordinates(run.rank)
        assert run.losses == pytest.approx(want, rel=1e-5), run.rank


@pytest.mark.slow
def test_every_rank_holds_its_slice_of_the_single_process_model(runs, reference):
    from distlab.parallel.compose import dense_shard
    from distlab.parallel.moe.gpt import dense_expert_name

    model, _, _ = reference
    dense = dict(model.named_parameters())  # the tied head is tok.weight
    local = MOE.num_experts // EP
    covered = set()
    for run in runs:
        where = run.coordinates
        experts = set()
        for name, shard in run.shards.items():
            dense_name = dense_expert_name(name, where["ep"], local)
            want = dense_shard(
                dense_name, dense[dense_name].detach(), TP, where["tp"], CONFIG.vocab
            )
            where_name = f"rank {run.rank} {name}"
            torch.testing.assert_close(
                shard, want, rtol=1e-5, atol=1e-6, msg=lambda m, at=where_name: f"{at}: {m}"
            )
            covered.add(dense_name)
            if ".experts." in name:
                experts.add(int(dense_name.split(".")[4]))
        assert experts == set(range(where["ep"] * local, (where["ep"] + 1) * local))
    assert covered == set(dense)
    start = dict(type(model)(CONFIG, MOE, seed=0).named_parameters())
    assert all(not torch.equal(start[n], dense[n]) for n in dense)  # every parameter trained


@pytest.mark.slow
def test_tokens_are_dropped_as_the_capacity_formula_says(runs, reference):
    _, _, want_dropped = reference
    capacity = expert_capacity(
        TOKENS_PER_RANK, MOE.num_experts, top_k=MOE.top_k, capacity_factor=MOE.capacity_factor
    )
    total = 0
    for run in runs:
        for step, layers in enumerate(run.moe_stats):
            for layer, stats in enumerate(layers):
                assert stats.capacity == capacity
                assert sum(stats.routed) == TOKENS_PER_RANK * MOE.top_k
                over = sum(max(0, n - capacity) for n in stats.routed)
                assert stats.dropped == over
                replica = run.coordinates["dp"]
                assert stats.dropped == want_dropped[step][layer][replica]
                total += stats.dropped
    assert total > 0, "the test should exercise token dropping"


@pytest.mark.slow
def test_tp_ranks_route_the_same_tokens_the_same_way(runs):
    for first, second in zip(runs[0::2], runs[1::2]):
        assert first.coordinates["dp"] == second.coordinates["dp"]
        assert first.moe_stats == second.moe_stats


@pytest.mark.slow
def test_all_to_all_bytes_equal_calculator(runs):
    predicted = moe_all_to_all_comm(
        tokens=TOKENS_PER_RANK,
        hidden=CONFIG.hidden,
        num_experts=MOE.num_experts,
        ep=EP,
        top_k=MOE.top_k,
        capacity_factor=MOE.capacity_factor,
        moe_layers=1,
        bytes_per_element=4,
    ).total
    assert predicted > 0
    for run in runs:
        assert [step["ep"] for step in run.bytes_by_group] == [predicted] * STEPS, run.rank


def test_grouped_moe_routes_each_group_on_its_own():
    from distlab.parallel.moe.gpt import GroupedMoE
    from distlab.parallel.moe.layer import MoE

    settings = {"top_k": 2, "capacity_factor": 1.0, "seed": 3}
    grouped = GroupedMoE(8, 12, 4, groups=2, **settings)
    plain = MoE(8, 12, 4, **settings)
    x = torch.randn(4, 5, 8, generator=torch.Generator().manual_seed(0))
    y = grouped(x)
    parts, losses = [], []
    for part in x.chunk(2):
        parts.append(plain(part))
        losses.append(plain.aux_loss)
    assert torch.equal(y, torch.cat(parts))
    assert torch.equal(grouped.aux_loss, torch.stack(losses).mean())
    capacity = expert_capacity(2 * 5, 4, top_k=2, capacity_factor=1.0)  # 2 sequences of 5
    assert [r.capacity for r in grouped.routings] == [capacity, capacity]
    with pytest.raises(ValueError, match="batch=4 is not divisible by the number of routing"):
        GroupedMoE(8, 12, 4, groups=3)(x)
    with pytest.raises(ValueError, match="groups must be an integer >= 1, got 0"):
        GroupedMoE(8, 12, 4, groups=0)


@pytest.mark.parametrize("every, moe_blocks", [(1, [0, 1, 2, 3]), (2, [1, 3]), (4, [3])])
def test_moe_blocks(every, moe_blocks):
    from distlab.parallel.moe.gpt import GroupedMoE, MoEGPT, dense_expert_name, moe_layers

    config = GPTConfig(vocab=30, seq_len=8, hidden=16, heads=4, layers=4)
    model = MoEGPT(config, MoEConfig(every=every), routing_groups=2)
    found = [i for i, b in enumerate(model.blocks) if isinstance(b.mlp, GroupedMoE)]
    assert found == moe_blocks and len(moe_layers(model)) == len(moe_blocks)
    assert all(layer.groups == 2 for layer in moe_layers(model))
    assert dense_expert_name("blocks.1.mlp.experts.1.fc1.weight", 1, 2) == (
        "blocks.1.mlp.experts.3.fc1.weight"
    )
    assert dense_expert_name("blocks.1.mlp.router.weight", 1, 2) == "blocks.1.mlp.router.weight"


@pytest.mark.parametrize(
    "config, moe, degrees, message",
    [
        (CONFIG, MOE, (2, 3, 4), "ep=3 must divide cp\\*dp=4"),
        (CONFIG, MoEConfig(num_experts=3), (2, 2, 4), "num_experts=3 is not divisible"),
        (GPTConfig(hidden=15, heads=3), MOE, (2, 2, 4), "heads=3 is not divisible by the"),
        (GPTConfig(hidden=16, heads=1), MOE, (2, 2, 4), "heads=1 is not divisible by the"),
    ],
)
def test_bad_degrees_name_the_value(config, moe, degrees, message):
    from distlab.core.layout import Layout
    from distlab.parallel.compose import check_model
    from distlab.parallel.moe.gpt import MoEGPT

    tp, ep, dp = degrees
    with pytest.raises(ValueError, match=message):
        check_model(MoEGPT(config, moe), Layout(tp=tp, ep=ep, dp=dp))


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"steps": 0}, "steps must be an integer >= 1, got 0"),
        ({"aux_weight": -0.1}, "aux_weight must be .*, got -0.1"),
    ],
)
def test_bad_training_settings(settings, message):
    from distlab.core.layout import Layout
    from distlab.parallel.compose import train
    from distlab.parallel.moe.gpt import MoEGPT

    tokens, targets = gpt_batch(BATCH, CONFIG, seed=1)
    options = {"steps": 1, "lr": LR, **settings}
    with pytest.raises(ValueError, match=message):
        train(MoEGPT(CONFIG, MOE), Layout(tp=TP, ep=EP, dp=DP), tokens, targets, **options)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"top_k": 3}, "top_k must be 1 or 2, got 3"),
        ({"every": 0}, "every must be an integer >= 1, got 0"),
        ({"num_experts": 1, "top_k": 2}, "top_k=2 must be <= num_experts=1"),
        ({"capacity_factor": 0}, "capacity_factor"),
    ],
)
def test_bad_moe_config(fields, message):
    with pytest.raises(ValueError, match=message):
        MoEConfig(**fields)


def test_bad_degrees_end_the_job_with_the_rank_traceback():
    moe = MoEConfig(num_experts=3, top_k=2, capacity_factor=1.0, ffn_hidden=24)
    with pytest.raises(distlab.RankError) as failure:
        distlab.run(_train, 4, args=(2, 2, 2, CONFIG, moe), timeout=60, show_output=False)
    assert "num_experts=3 is not divisible by the expert-parallel size ep 2" in str(failure.value)
    assert "check_model" in failure.value.remote_traceback


def test_one_failing_rank_ends_every_rank_with_its_traceback():
    with pytest.raises(distlab.RankError) as failure:
        distlab.run(_train, 8, args=(TP, EP, DP, CONFIG, MOE, 5), timeout=60, show_output=False)
    assert failure.value.rank == 5  # the others were waiting for it in build_mesh
    assert "batch=6 is not divisible by the dp * micro_batches 4" in failure.value.remote_traceback
