"""Fit alpha, beta (and gamma) to measured collective times, then predict the rest.

On a laptop, the ranks of ``distlab.run`` are processes on a few CPU cores
talking over loopback TCP. There is no per-rank link: every byte any rank
sends is copied by the same cores through the same kernel, so the network
is **one shared medium** (:func:`~distlab.sim.topology.shared_bus`): messages
sent at the same time divide its bandwidth. On such a bus the replay
(:mod:`distlab.sim.replay`) of a schedule takes exactly

    T = S alpha + B beta + R gamma

where ``S`` is the number of steps that send anything, ``B`` the bytes all
ranks send in total, and ``R`` the bytes reduced on the slowest receiver,
summed over steps. So each measured run is one row of a linear
least-squares problem in ``(alpha, beta, gamma)``; ``S``, ``B`` and ``R``
come from replaying the schedule with unit ``alpha``, ``beta`` or ``gamma``.
Rows are divided by the measured time, so the fit minimises *relative*
error (small messages count as much as large ones), and the coefficients
are kept >= 0.

Which schedule a record ran: distlab's own algorithms are their schedules,
plus ``ceil(log2 n)`` small messages that every distlab collective sends
first to check that all ranks passed matching tensors
(:mod:`distlab.collectives.agree`). ``"builtin"`` (torch.distributed on gloo)
is modelled by the schedule gloo implements: all-reduce is a ring
(``gloo/allreduce.cc``; gloo pipelines it in segments, so its latency
differs from distlab's ring), all-gather a ring (``gloo/allgather.cc``) and
broadcast a binomial tree (``gloo/broadcast.cc``). Other built-ins are left out.

Records are the dicts ``distlab bench --json`` prints: ``collective``,
``algorithm``, ``world_size``, ``bytes``, ``count``, ``time_s``...
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distlab.core.collective_schedule import log2_ceil

from .algorithms import algorithm_name, build_schedule
from .replay import simulate
from .topology import ClusterSpec, Link, shared_bus

#: Built-in gloo collectives and the distlab schedule that moves the same bytes in the same rounds.
BUILTIN_MODELS = {
    "all_reduce": "ring_all_reduce",  # gloo/allreduce.cc: ring reduce-scatter + all-gather
    "all_gather": "ring_all_gather",  # gloo/allgather.cc: ring, each block sent in two halves
    "broadcast": "tree_broadcast",  # gloo/broadcast.cc: binomial tree, log2ceil(n) rounds
}


@dataclass(frozen=True)
class AlphaBetaFit:
    """Fitted ``alpha`` (s), ``beta`` (s/byte) and ``gamma`` (s/byte, 0 unless fitted)."""

    alpha: float
    beta: float
    gamma: float
    n_points: int
    rms_relative_error: float  # on the records it was fitted to

    @property
    def bandwidth(self) -> float:
        """Bytes/s of the shared medium (1 / beta)."""
        return 1.0 / self.beta if self.beta > 0 else float("inf")

    def link(self) -> Link:
        return Link("fitted shared medium (loopback TCP)", self.alpha, self.bandwidth)

    def cluster(self, world_size: int) -> ClusterSpec:
        """This machine as a cluster: ``world_size`` ranks on one shared medium."""
        return shared_bus(world_size, self.link(), name="this machine (fitted)")


@dataclass(frozen=True)
class Prediction:
    """Predicted vs measured time of one record."""

    collective: str
    algorithm: str
    world_size: int
    n_bytes: int
    measured_s: float
    predicted_s: float

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s


def load_records(path: str | Path) -> list[dict]:
    """Records from a ``distlab bench --json`` file: a JSON list, or one object per line."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        data = data.get("records", [data])
    return list(data)


def record_model(record: dict) -> tuple[str, int]:
    """The schedule name that models ``record`` and its extra latency steps
    (the agreement check of distlab collectives). Raises ``ValueError`` when
    there is no model for it."""
    _check_record(record)
    collective, algorithm, n = record["collective"], record["algorithm"], record["world_size"]
    if algorithm == "builtin":
        if collective not in BUILTIN_MODELS:
            raise ValueError(
                f"no model for gloo's built-in {collective}; modelled: {sorted(BUILTIN_MODELS)}"
            )
        return BUILTIN_MODELS[collective], 0
    name = algorithm_name(algorithm, collective)
    return name, log2_ceil(n) if n > 1 else 0


def features(record: dict) -> tuple[float, float, float]:
    """``(S, B, R)`` of ``record`` on a shared medium (module docstring)."""
    name, extra_steps = record_model(record)
    schedule = _schedule(name, record)
    n, size, itemsize = record["world_size"], record["bytes"], _itemsize(record)
    instant = Link("instant", 0.0, float("inf"))

    def replay(link: Link, gamma: float = 0.0) -> float:
        return simulate(schedule, shared_bus(n, link), size, itemsize=itemsize, gamma=gamma).time_s

    steps = replay(Link("unit latency", 1.0, float("inf"))) + extra_steps
    return steps, replay(Link("unit beta", 0.0, 1.0)), replay(instant, gamma=1.0)


def fit_alpha_beta(records: Iterable[dict], *, fit_gamma: bool = False) -> AlphaBetaFit:
    """Least-squares ``alpha``, ``beta`` (and ``gamma``) >= 0 over ``records``, relative error.

    Without ``fit_gamma`` reductions are folded into ``beta``. ``gamma`` can
    only be told apart from ``beta`` when the records mix algorithms whose
    reduced and sent bytes are not proportional (a ring on one world size cannot).
    """
    rows, times = [], []
    for record in records:
        s, b, r = features(record)
        rows.append([s, b, r] if fit_gamma else [s, b])
        times.append(float(record["time_s"]))
    n_params = 3 if fit_gamma else 2
    if len(rows) < n_params:
        raise ValueError(f"need at least {n_params} records to fit, got {len(rows)}")
    a = np.array(rows) / np.array(times)[:, None]
    if np.linalg.matrix_rank(a) < n_params:
        what = "gamma from beta" if fit_gamma else "alpha from beta (vary the sizes)"
        raise ValueError(f"these records cannot separate {what}")
    coef = _nonnegative_least_squares(a, np.ones(len(times)))
    residual = a @ coef - 1.0
    alpha, beta = coef[0], coef[1]
    gamma = coef[2] if fit_gamma else 0.0
    if beta <= 0:
        raise ValueError(
            "the fitted beta is 0: the records do not constrain bandwidth (vary the sizes)"
        )
    rms = float(np.sqrt(np.mean(residual**2)))
    return AlphaBetaFit(float(alpha), float(beta), float(gamma), len(rows), rms)


def predict(fit: AlphaBetaFit, record: dict) -> float:
    """Predicted seconds for ``record``: its schedule replayed on the fitted shared medium."""
    name, extra_steps = record_model(record)
    n = record["world_size"]
    result = simulate(
        _schedule(name, record),
        fit.cluster(n),
        record["bytes"],
        itemsize=_itemsize(record),
        gamma=fit.gamma,
    )
    return result.time_s + extra_steps * fit.alpha


def compare(fit: AlphaBetaFit, records: Iterable[dict]) -> list[Prediction]:
    """Predicted vs measured for every record that has a model (others are left out)."""
    out = []
    for record in records:
        try:
            predicted = predict(fit, record)
        except ValueError:
            continue
        out.append(
            Prediction(
                record["collective"],
                record["algorithm"],
                record["world_size"],
                record["bytes"],
                float(record["time_s"]),
                predicted,
            )
        )
    return out


def select(records: Iterable[dict], *, algorithms: Sequence[str], collective: str = "all_reduce"):
    """The records of ``collective`` run with one of ``algorithms`` (e.g. ``("ring",)``)."""
    return [r for r in records if r["collective"] == collective and r["algorithm"] in algorithms]


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| with x >= 0, by trying every set of free coefficients (there are <= 3)."""
    k = a.shape[1]
    best, best_norm = np.zeros(k), float(np.sum(b**2))
    for size in range(1, k + 1):
        for free in itertools.combinations(range(k), size):
            x_free, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if np.any(x_free < 0):
                continue
            x = np.zeros(k)
            x[list(free)] = x_free
            norm = float(np.sum((a @ x - b) ** 2))
            if norm < best_norm:
                best, best_norm = x, norm
    return best


def _schedule(name: str, record: dict):
    return build_schedule(name, record["world_size"], ranks_per_node=record.get("ranks_per_node"))


def _itemsize(record: dict) -> int:
    count = record.get("count")
    if count:
        if record["bytes"] % count:
            raise ValueError(f"record bytes={record['bytes']} is not a multiple of count={count}")
        return record["bytes"] // count
    return 4


def _check_record(record: dict) -> None:
    missing = [
        k for k in ("collective", "algorithm", "world_size", "bytes", "time_s") if k not in record
    ]
    if missing:
        raise ValueError(f"bench record {record!r} lacks {missing}")
    if record["time_s"] <= 0 or record["bytes"] <= 0:
        raise ValueError(f"bench record needs time_s > 0 and bytes > 0, got {record!r}")
