"""The pipeline executor on 2, 3 and 4 gloo ranks against single-process training.

One launch per pipeline size runs every schedule (GPipe, 1F1B, interleaved
with v = 2, ZB-H1; and on 4 ranks, some on 2 and 3, ZB-H2, the V-shaped ZB-V
and DualPipeV, the bidirectional DualPipe, breadth-first with v = 2) on the tiny GPT (6 blocks, tied embeddings, so the first
and last stages share a weight), for a sample of micro-batch counts m in
1..8: gradients after one step and losses over 10 SGD steps must equal
training the whole model on the whole batch in one process. Tolerance:
m micro-batches add their gradients in another order than one big batch,
so fp32 results differ by rounding: ``rtol=1e-5, atol=1e-6``.

Each rank also reports what it measured: its timeline (every action starts
after the actions it depends on ended, on the machine's shared monotonic
clock), and its peak in-flight activations, which must equal the count the
schedule's replay predicts and, on the first stage, the closed form of
:func:`distlab.calc.pipeline.in_flight_micro_batches`; in bf16 with dropout,
the first stage's saved bytes equal Korthikanti et al.'s per-layer count
(:func:`distlab.calc.memory.activation_bytes_per_layer`) plus the named extras.
"""

from __future__ import annotations

import pytest
import torch

import distlab
from distlab.calc.memory import activation_bytes_per_layer
from distlab.calc.pipeline import in_flight_micro_batches
from distlab.core.pipeline_schedule import build
from distlab.models import GPT, GPTConfig, gpt_batch
from distlab.sim.pipeline_replay import check

CONFIG = GPTConfig(layers=6)  # 8 pipeline layers: embedding, 6 blocks, head
STEPS, LR = 10, 0.05
# p: [(schedule, m, v)], m sampled from 1..8 so every p sees small and large m
CASES = {
    2: [("gpipe", 1, 1), ("1f1b", 3, 1), ("interleaved", 4, 2), ("zb_h1", 2, 1)]
    + [("zb_v", 3, 2), ("zb_v", 2, 2), ("dualpipe_v", 4, 2), ("dualpipe", 4, 2)],
    3: [("gpipe", 4, 1), ("1f1b", 2, 1), ("interleaved", 3, 2), ("zb_h1", 5, 1)]
    + [("zb_h2", 4, 1), ("breadth_first", 3, 2)],
    4: [("gpipe", 6, 1), ("1f1b", 8, 1), ("interleaved", 4, 2), ("zb_h1", 4, 1)]
    + [("zb_h2", 8, 1), ("zb_v", 8, 2), ("dualpipe_v", 8, 2), ("dualpipe", 8, 2)]
    + [("breadth_first", 4, 2)],
}


def batch_for(m: int, seed: int):
    return gpt_batch(2 * m, CONFIG, seed=seed)  # two sequences per micro-batch


def pipeline_worker(rank, world_size, cases):
    from distlab.parallel.pipeline import build, gpt_stage, run_pipeline

    torch.set_num_threads(1)  # one core per rank, no oversubscription

    out = []
    for seed, (name, m, v) in enumerate(cases):
        model = GPT(CONFIG, seed=0)
        schedule = build(name, world_size, m, chunks=v)
        stage = gpt_stage(
            model,
            rank,
            world_size,
            chunks=v,
            placement=schedule.placement,
            bidirectional=schedule.bidirectional,
        )
        optimizer = torch.optim.SGD(stage.parameters(), lr=LR, momentum=0.9)
        tokens, targets = batch_for(m, seed)
        losses, first = [], None
        for step in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            run = run_pipeline(schedule, stage, tokens, targets)
            if step == 0:
                mine = {id(p) for p in stage.parameters()}
                grads = {n: p.grad.clone() for n, p in model.named_parameters() if id(p) in mine}
                first = (run, grads)
            losses.append(run.loss)
            optimizer.step()
        out.append({"run": first[0], "grads": first[1], "losses": losses})
    return out


def reference(m: int, seed: int):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a loaded 2-core machine run 40x slower
    try:
        return _train_single_process(m, seed)
    finally:
        torch.set_num_threads(threads)


def _train_single_process(m: int, seed: int):
    model = GPT(CONFIG, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    tokens, targets = batch_for(m, seed)
    losses, grads = [], None
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(tokens, targets)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append(loss.item())
        optimizer.step()
    return grads, losses


@pytest.fixture(scope="module", params=sorted(CASES))
def launched(request):
    p = request.param
    return p, distlab.run(pipeline_worker, p, args=(CASES[p],), timeout=300)


@pytest.mark.slow
def test_gradients_and_losses_equal_single_process(launched):
    p, results = launched
    for index, (name, m, v) in enumerate(CASES[p]):
        want_grads, want_losses = reference(m, index)
        grads = {}
        for rank_results in results:
            grads.update(rank_results[index]["grads"])
        assert grads.keys() == want_grads.keys(), (name, m, v)
        for key, want in want_grads.items():
            torch.testing.assert_close(grads[key], want, rtol=1e-5, atol=1e-6, msg=key)
        # the rank holding the last virtual stage has the loss: p - 1, or 0 for a V;
        # DualPipe's two directions end on ranks 0 and p - 1, each with its half
        schedule = build(name, p, m, chunks=v)
        ends = {schedule.rank_of(schedule.route(i)[1]) for i in range(m)}
        expected_ends = (
            {0, p - 1} if name == "dualpipe" else {0} if schedule.placement == "v" else {p - 1}
        )
        assert ends == expected_ends
        assert all(
            (r[index]["losses"][0] is None) == (i not in ends) for i, r in enumerate(results)
        )
        losses = [sum(results[i][index]["losses"][step] for i in ends) for step in range(STEPS)]
        assert losses == pytest.approx(want_losses, rel=1e-5), (name, m, v)
        assert losses[-1] < losses[0]


@pytest.mark.slow
def test_measured_timeline_respects_dependencies(launched):
    from distlab.parallel.pipeline import measured_timeline

    p, results = launched
    for index, (name, m, v) in enumerate(CASES[p]):
        schedule = build(name, p, m, chunks=v)
        timeline = measured_timeline(schedule, [r[index]["run"] for r in results])
        assert len(timeline.entries) == sum(len(actions) for actions in schedule.ranks)
        end = {}
        for e in timeline.entries:
            j = schedule.virtual_stage(e.rank, e.action.chunk)
            end[(e.action.kind if e.action.kind != "I" else "B", j, e.action.micro_batch)] = e.end
        for e in timeline.entries:
            j, i = schedule.virtual_stage(e.rank, e.action.chunk), e.action.micro_batch
            first, last = schedule.route(i)
            if e.action.kind == "F" and j > first:
                assert e.start >= end[("F", j - 1, i)]
            if e.action.kind in ("B", "I") and j < last:
                assert e.start >= end[("B", j + 1, i)]
        assert 0 < timeline.bubble_fraction < 1


@pytest.mark.slow
def test_in_flight_activations_as_the_schedule_and_papers_say(launched):
    p, results = launched
    for index, (name, m, v) in enumerate(CASES[p]):
        runs = [r[index]["run"] for r in results]
        schedule = build(name, p, m, chunks=v)
        predicted = check(schedule)
        assert tuple(run.peak_in_flight for run in runs) == predicted.peak_in_flight
        first = runs[0]
        if name == "zb_v" and m < 2 * p - 1:  # runs (torch's order); no closed form
            continue
        expected = in_flight_micro_batches(p, m, schedule=name, virtual_stages=v)
        assert first.peak_in_flight * schedule.chunk_share == pytest.approx(expected)
        if v == 1 and name != "zb_h2":  # peak = in flight x one micro-batch's bytes
            assert first.peak_activation_bytes == expected * first.activation_bytes[0]
        if name in ("zb_h1", "zb_h2", "zb_v", "dualpipe_v", "dualpipe"):
            assert max(run.peak_pending_weight_grads for run in runs) > 0


def bf16_worker(rank, world_size, m):
    from distlab.parallel.pipeline import gpt_stage, one_f_one_b, run_pipeline

    torch.set_num_threads(1)
    config = GPTConfig(layers=2, dropout=0.1)
    model = GPT(config, seed=0).to(torch.bfloat16).train()
    stage = gpt_stage(model, rank, world_size)  # embedding + block 0 | block 1 + head
    tokens, targets = gpt_batch(2 * m, config)
    return run_pipeline(one_f_one_b(world_size, m), stage, tokens, targets)


def test_first_stage_activation_bytes_match_korthikanti():
    """Rank 0 holds the embedding and one GPT block, in bf16 with dropout (the paper's
    setting). One micro-batch saves the block's sbh(34 + 5as/h) bytes
    (:func:`distlab.calc.memory.activation_bytes_per_layer`), plus what the paper leaves
    out: LayerNorm's mean and 1/std (4 tensors of b s bf16 numbers) and the embedding's
    token and position indices (int64). Its peak is that times 1F1B's in-flight count."""
    m, b = 4, 2
    runs = distlab.run(bf16_worker, 2, args=(m,), timeout=300)
    c = GPTConfig(layers=2)
    per_layer = activation_bytes_per_layer(
        seq_len=c.seq_len, micro_batch=b, hidden=c.hidden, heads=c.heads
    )
    extras = 4 * b * c.seq_len * 2 + b * c.seq_len * 8 + c.seq_len * 8
    assert runs[0].activation_bytes[0] == per_layer + extras
    in_flight = in_flight_micro_batches(2, m, schedule="1f1b")
    assert runs[0].peak_activation_bytes == in_flight * (per_layer + extras)
