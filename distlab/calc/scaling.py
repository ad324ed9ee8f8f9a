"""Scaling laws of parallel computing and of large-batch training.

* Amdahl (1967, AFIPS, pp. 483-485): a job with serial fraction f runs at most 1 / (f + (1-f)/n)
  times faster on n workers (fixed problem size: strong scaling).
* Gustafson (1988, CACM 31(5), pp. 532-533): if the parallel part grows with n (weak scaling), the
  scaled speedup is f + (1-f) n.
* Parallel efficiency: speedup / n.
* Linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD:
  Training ImageNet in 1 Hour", Section 2.1): when the minibatch grows by k,
  multiply the learning rate by k; ramp it up from the small-batch rate over
  the first epochs (gradual warmup, Section 2.2; 5 epochs in the paper).
* Effective (global) batch = local batch x data-parallel ranks x gradient
  accumulation steps.
* Stragglers: a synchronous step waits for its slowest rank, so if each of n
  ranks is independently slow in a step with probability p, the step is slow
  with probability 1 - (1 - p)^n (Dean and Barroso 2013, "The Tail at Scale",
  CACM 56(2), the same argument for a request fanned out to n servers).
"""

from __future__ import annotations

from distlab.core.checks import fraction, nonnegative_int, positive, positive_int


def amdahl_speedup(serial_fraction: float, n: int) -> float:
    """1 / (f + (1 - f) / n). ``amdahl_speedup(0.05, 8)`` is 5.93; the limit as n grows is 1/f."""
    f = fraction("serial_fraction", serial_fraction)
    workers = positive_int("n", n)
    return 1.0 / (f + (1.0 - f) / workers)


def gustafson_speedup(serial_fraction: float, n: int) -> float:
    """f + (1 - f) n: speedup when the parallel work grows with n (Gustafson 1988, pp. 532-533)."""
    f = fraction("serial_fraction", serial_fraction)
    return f + (1.0 - f) * positive_int("n", n)


def speedup(time_one: float, time_n: float) -> float:
    """Measured speedup: time on one worker / time on n."""
    return positive("time_one", time_one) / positive("time_n", time_n)


def parallel_efficiency(speedup: float, n: int) -> float:
    """speedup / n: 1.0 is perfect scaling."""
    return positive("speedup", speedup) / positive_int("n", n)


def linear_scaling_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """base_lr * batch / base_batch (Goyal et al. 2017, Section 2.1: 0.1 for 256 images,
    so 3.2 for 8192)."""
    return (
        positive("base_lr", base_lr)
        * positive_int("batch", batch)
        / positive_int("base_batch", base_batch)
    )


def warmup_lr(step: int, *, base_lr: float, target_lr: float, warmup_steps: int) -> float:
    """Gradual warmup (Goyal et al. 2017, Section 2.2): the learning rate rises
    linearly from ``base_lr`` at step 0 to ``target_lr`` at ``warmup_steps``
    and stays there."""
    step = nonnegative_int("step", step)
    lo, hi = positive("base_lr", base_lr), positive("target_lr", target_lr)
    n = positive_int("warmup_steps", warmup_steps)
    if step >= n:
        return hi
    return lo + (hi - lo) * step / n


def effective_batch(local: int, dp: int, accumulation: int = 1) -> int:
    """Samples per optimizer step: local batch x data-parallel ranks x accumulation steps."""
    return (
        positive_int("local", local)
        * positive_int("dp", dp)
        * positive_int("accumulation", accumulation)
    )


def straggler_probability(p_slow: float, n: int) -> float:
    """1 - (1 - p)^n: chance that at least one of ``n`` ranks, each slow with
    probability ``p_slow`` independently, slows a synchronous step
    (Dean and Barroso 2013). 1% per rank on 100 ranks: 63%."""
    p = fraction("p_slow", p_slow)
    return 1.0 - (1.0 - p) ** positive_int("n", n)
