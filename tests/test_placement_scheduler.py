"""The event-driven scheduler: gang starts, checkpoints, preemption, failures, elasticity, policies."""

import numpy as np
import pytest

from distlab.core.layout import Layout
from distlab.placement.allocate import allocate, stranded_fraction
from distlab.placement.jobs import Job, mixed_jobs
from distlab.placement.scheduler import NodeEvent, random_failures, simulate
from distlab.sim.topology import preset

TWO_NODES = preset("dgx-h100", nodes=2)


def rec(result, name):
    return next(r for r in result.records if r.job.name == name)


def test_run_time_includes_periodic_checkpoints():
    job = Job("a", Layout(tp=8), duration_s=3600, checkpoint_interval_s=1000, checkpoint_s=60)
    r = simulate([job], TWO_NODES)
    # 3600 s of work, saves after 1000, 2000, 3000 s: three saves of 60 s
    assert rec(r, "a").end_s == pytest.approx(3600 + 3 * 60)
    assert rec(r, "a").checkpoint_gpu_s == pytest.approx(3 * 60 * 8)


def test_gang_scheduling_waits_for_all_gpus():
    small = Job("small", Layout(tp=8), duration_s=1000, checkpoint_interval_s=5000)
    big = Job("big", Layout(tp=8, dp=2), duration_s=500, submit_s=10, checkpoint_interval_s=5000)
    filler = Job("filler", Layout(tp=8), duration_s=2000, checkpoint_interval_s=5000)
    r = simulate([small, filler, big], TWO_NODES, preemption=False)
    assert rec(r, "big").first_start_s == pytest.approx(2000)  # needs both nodes at once
    assert rec(r, "big").wait_s == pytest.approx(1990)


def test_preemption_loses_work_since_last_checkpoint_and_pays_restart():
    low = Job(
        "low",
        Layout(tp=8, dp=2),
        duration_s=10_000,
        checkpoint_interval_s=1000,
        checkpoint_s=10,
        restart_s=100,
    )
    high = Job(
        "high",
        Layout(tp=8, dp=2),
        priority=1,
        submit_s=2500,
        duration_s=500,
        checkpoint_interval_s=5000,
    )
    r = simulate([low, high], TWO_NODES)
    lo, hi = rec(r, "low"), rec(r, "high")
    assert lo.preemptions == 1
    # at 2500 s: two 1010 s cycles (2000 s saved), then 480 s of unsaved work on 16 GPUs
    assert lo.lost_preemption_gpu_s == pytest.approx(480 * 16)
    assert hi.first_start_s == 2500 and hi.end_s == pytest.approx(3000)
    # resumes at 3000 s: restart 100 s, then the remaining 8000 s with 7 saves of 10 s
    assert lo.end_s == pytest.approx(3000 + 100 + 8000 + 7 * 10)
    assert lo.useful_gpu_s == pytest.approx(10_000 * 16)


def test_lowest_priority_victim_is_chosen_and_equal_priority_never_preempts():
    jobs = [
        Job("p0", Layout(tp=8), priority=0, duration_s=5000),
        Job("p1", Layout(tp=8), priority=1, duration_s=5000),
        Job("p2", Layout(tp=8), priority=2, submit_s=100, duration_s=100),
        Job("p1b", Layout(tp=8), priority=1, submit_s=300, duration_s=100),
    ]
    r = simulate(jobs, TWO_NODES)
    assert rec(r, "p2").first_start_s == 100
    # p0 resumes when p2 ends at 200, and is evicted again by p1b at 300; p1 never
    assert rec(r, "p0").preemptions == 2 and rec(r, "p1").preemptions == 0
    assert rec(r, "p1b").first_start_s == 300
    equal = [
        Job("a", Layout(tp=8, dp=2), priority=1, duration_s=500),
        Job("b", Layout(tp=8), priority=1, submit_s=10),
    ]
    r = simulate(equal, TWO_NODES)
    assert rec(r, "a").preemptions == 0 and rec(r, "b").first_start_s == 500


def test_node_failure_requeues_a_rigid_job():
    job = Job(
        "rigid",
        Layout(tp=8, dp=2),
        duration_s=4000,
        checkpoint_interval_s=1000,
        checkpoint_s=0,
        restart_s=50,
    )
    fail = [NodeEvent(1500, 1, "fail"), NodeEvent(2000, 1, "recover")]
    r = simulate([job], TWO_NODES, failures=fail)
    x = rec(r, "rigid")
    assert x.failures == 1 and x.resizes == 0
    assert x.lost_failure_gpu_s == pytest.approx(500 * 16)
    assert x.end_s == pytest.approx(2000 + 50 + 3000)


def test_elastic_job_shrinks_then_grows_back():
    cluster = preset("dgx-h100", nodes=4)
    job = Job(
        "el",
        Layout(tp=8, dp=4),
        duration_s=8000,
        checkpoint_interval_s=1000,
        checkpoint_s=0,
        restart_s=50,
        elastic=True,
        min_dp=2,
    )
    fail = [NodeEvent(1500, 3, "fail"), NodeEvent(2500, 3, "recover")]
    r = simulate([job], cluster, failures=fail)
    x = rec(r, "el")
    assert x.failures == 1 and x.resizes == 2 and x.state == "done"
    assert x.lost_failure_gpu_s == pytest.approx(500 * 32)
    # 1000 s saved; 1500-1550 restart; 950 s at 3/4 speed; grow at 2500: restart 50 s
    done_at_grow = 1000 + 950 * 3 / 4
    assert x.end_s == pytest.approx(2500 + 50 + (8000 - done_at_grow))
    assert x.useful_gpu_s == pytest.approx(8000 * 32)
    sizes = [seg[2] for seg in x.segments]
    assert sizes == [32, 24, 32]


def test_infeasible_jobs_wait_with_a_reason_and_others_run():
    jobs = [
        Job("huge", Layout(tp=8, dp=4)),
        Job("wide", Layout(tp=16)),
        Job("ok", Layout(tp=8), duration_s=100),
    ]
    r = simulate(jobs, TWO_NODES)
    assert rec(r, "huge").state == "infeasible" and "needs 32 GPUs" in rec(r, "huge").reason
    assert rec(r, "wide").state == "infeasible" and "tp=16" in rec(r, "wide").reason
    assert rec(r, "ok").state == "done"


def test_bare_layouts_are_jobs_with_default_scheduling():
    r = simulate([Layout(tp=8), Layout(tp=8, dp=2)], TWO_NODES)
    assert [x.job.name for x in r.records] == ["job0", "job1"]
    assert [x.job.layout.world_size for x in r.records] == [8, 16]
    assert all(x.state == "done" for x in r.records)


def test_whole_simulation_accounts_every_gpu_second():
    cluster = preset("dgx-h100", nodes=16)
    jobs = mixed_jobs(150, cluster_gpus=cluster.world_size, load=1.1, seed=4)
    fails = random_failures(cluster, mtbf_s=40 * 3600, repair_s=3600, horizon_s=40 * 3600, seed=1)
    r = simulate(jobs, cluster, failures=fails)
    s = r.stats()
    assert s.completed == len(jobs) and s.preemptions > 0 and s.failures_hit > 0
    for x in r.records:
        assert x.useful_gpu_s == pytest.approx(x.job.duration_s * x.job.layout.world_size)
        busy = sum((end - start) * gpus for start, end, gpus, _ in x.segments)
        spent = x.useful_gpu_s + x.lost_preemption_gpu_s + x.lost_failure_gpu_s
        assert busy == pytest.approx(spent + x.restart_gpu_s + x.checkpoint_gpu_s)
    assert all(p.busy_gpus <= p.up_gpus for p in r.timeline)
    assert 0 < s.utilisation <= 1
    assert r.stats() == simulate(jobs, cluster, failures=fails).stats()  # deterministic


def test_best_fit_fragments_less_than_first_fit_on_a_mixed_workload():
    """Measured, not assumed: time-averaged stranded and partly-used-node free GPUs, 4 seeds."""
    cluster = preset("dgx-h100", nodes=32)
    stats = {"first-fit": [], "best-fit": []}
    for seed in range(4):
        jobs = mixed_jobs(200, cluster_gpus=cluster.world_size, load=0.9, seed=seed)
        for policy, runs in stats.items():
            runs.append(simulate(jobs, cluster, policy=policy, preemption=False).stats())
    ff = np.mean([s.mean_partial_node_free for s in stats["first-fit"]])
    bf = np.mean([s.mean_partial_node_free for s in stats["best-fit"]])
    assert bf < ff
    assert np.mean([s.mean_stranded for s in stats["best-fit"]]) < np.mean(
        [s.mean_stranded for s in stats["first-fit"]]
    )


def test_allocation_policies_and_fragmentation_metric():
    free = np.array([8, 3, 5, 8])
    assert allocate(free, 1, 2, 8, 1, "first-fit") == [(0,)]
    assert allocate(free, 1, 2, 8, 1, "best-fit") == [(1,)]  # fullest node that fits
    assert allocate(free, 2, 2, 8, 1, "best-fit") == [(2,), (2,)]  # whole job on one node
    assert allocate(free, 20, 2, 8, 1, "best-fit") is None
    assert stranded_fraction(free, 4, 8) == pytest.approx((3 + 1) / 24)
    assert stranded_fraction(free, None, 8) == 0
    with pytest.raises(ValueError, match="unknown policy"):
        allocate(free, 1, 2, 8, 1, "worst-fit")


def test_thousand_jobs_on_1024_gpus_all_complete():
    """The time (target < 10 s) is measured by benchmarks/placement_scale.py, not here."""
    cluster = preset("dgx-h100", nodes=128)
    jobs = mixed_jobs(1000, cluster_gpus=cluster.world_size, load=1.0, seed=0)
    r = simulate(jobs, cluster)
    assert r.stats().completed == 1000
