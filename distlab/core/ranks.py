"""Process groups of a 5-D parallel job, in Megatron-core's convention.

A job with tensor (tp), context (cp), data (dp) and pipeline (pp) parallelism
numbers its ``world_size = tp * cp * dp * pp`` ranks as a mixed-radix number
whose digits are the rank's coordinate in each dimension. ``order`` names the
digits from the fastest-varying to the slowest: with the default
``"tp-cp-ep-dp-pp"``

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so the ``tp`` ranks of one tensor-parallel group are consecutive (they land on
one node when ranks fill nodes in order) and the pipeline stages are farthest
apart. The whole layout is one index grid: ``arange(world).reshape(sizes)``;
a dimension's groups are the grid's lines along that axis.

This reproduces ``RankGenerator`` / ``generate_masked_orthogonal_rank_groups``
in Megatron-core's ``megatron/core/parallel_state.py``, including the order of
the groups in each list (the other dimensions' coordinates enumerate the groups,
the first of them in ``order`` varying fastest) and the example in the docstring
of ``initialize_model_parallel`` (16 GPUs, tp=2, pp=4: TP groups [0,1], [2,3], ...;
PP groups [0,4,8,12], ...; DP groups [0,2], [1,3], [4,6], ...).

Expert parallelism follows Megatron-core too: ``ep`` does **not** multiply the
world size. The MoE layers re-split the ``cp * dp`` ranks that hold one
attention shard into ``ep`` expert-parallel ranks times ``cp * dp / ep``
expert-data-parallel ranks, with a second rank generator over
``(tp, ep, expert_dp, pp)`` in the same ``order`` (Megatron's "expert rank
generator", expert tensor parallelism = tp). So ``ep`` must divide ``cp * dp``,
and the ``"ep"`` and ``"expert_dp"`` groups come from that second grid.
"""

from __future__ import annotations

import numpy as np

from .checks import positive_int

DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"

#: The group lists :func:`rank_groups` returns.
GROUP_NAMES = ("tp", "cp", "dp", "pp", "dp-cp", "ep", "expert_dp")


def parse_order(order: str) -> list[str]:
    """Split ``"tp-cp-ep-dp-pp"`` into names; missing names are appended (their size is 1)."""
    if not isinstance(order, str):
        raise TypeError(f"order must be a string such as {DEFAULT_ORDER!r}, got {order!r}")
    names = [name.strip().lower() for name in order.split("-")]
    unknown = [n for n in names if n not in DIMENSIONS]
    if unknown:
        raise ValueError(f"order {order!r} names {unknown}; allowed names: {list(DIMENSIONS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"order {order!r} repeats a dimension; name each of {DIMENSIONS} once")
    return names + [n for n in DIMENSIONS if n not in names]


def check_degrees(world_size: int, *, tp: int, pp: int, dp: int, cp: int, ep: int) -> None:
    """Raise ``ValueError`` unless ``tp * cp * dp * pp == world_size`` and ``ep`` divides ``cp * dp``."""
    for name, value in (("world_size", world_size), ("tp", tp), ("pp", pp), ("dp", dp)):
        positive_int(name, value)
    positive_int("cp", cp)
    positive_int("ep", ep)
    if tp * cp * dp * pp != world_size:
        raise ValueError(
            f"degrees tp={tp} x cp={cp} x dp={dp} x pp={pp} = {tp * cp * dp * pp} "
            f"must equal world_size={world_size} (ep splits dp*cp and is not a factor)"
        )
    if (cp * dp) % ep:
        raise ValueError(
            f"ep={ep} must divide cp*dp={cp * dp}: expert parallelism re-splits the "
            f"data-parallel ranks of the MoE layers (Megatron-core convention)"
        )


def rank_groups(
    world_size: int,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    cp: int = 1,
    ep: int = 1,
    order: str = DEFAULT_ORDER,
) -> dict[str, list[list[int]]]:
    """The process groups of every parallel dimension, as lists of global ranks.

    Returns a dict with keys ``"tp"``, ``"cp"``, ``"dp"``, ``"pp"``, ``"dp-cp"``
    (the gradient all-reduce group when cp > 1), ``"ep"`` and ``"expert_dp"``.
    Each value partitions ``range(world_size)`` into groups of that dimension's
    size (see the module docstring for the convention and its source).

    >>> rank_groups(8, tp=2, pp=2, dp=2)["dp"]
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    """
    check_degrees(world_size, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep)
    names = parse_order(order)
    if ep > 1 and pp > 1 and names[-1] != "pp" and (cp * dp) // ep != dp:
        raise ValueError(
            f"order {order!r} does not end with pp, so the attention and MoE layers need the "
            f"same data-parallel size (Megatron-core requires it): dp={dp} but "
            f"expert_dp=cp*dp/ep={cp * dp // ep}"
        )
    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    expert = {"tp": tp, "cp": 1, "ep": ep, "dp": cp * dp // ep, "pp": pp}
    groups = {
        token: masked_groups(names, dense, token.split("-")) for token in ("tp", "cp", "dp", "pp")
    }
    groups["dp-cp"] = masked_groups(names, dense, ["dp", "cp"])
    groups["ep"] = masked_groups(names, expert, ["ep"])
    groups["expert_dp"] = masked_groups(names, expert, ["dp"])
    return groups


def group_array(
    world_size: int, dimension: str, *, order: str = DEFAULT_ORDER, **degrees: int
) -> np.ndarray:
    """One dense dimension's groups (``"tp"``, ``"cp"``, ``"dp"`` or ``"pp"``) as an
    ``(n_groups, size)`` array: ``rank_groups(world_size, **degrees)[dimension]`` without
    building every list (the planner asks for thousands of layouts of up to 16,384 ranks).
    ``degrees`` are ``tp``, ``pp``, ``dp`` and ``cp`` (default 1 each)."""
    if dimension not in ("tp", "cp", "dp", "pp"):
        raise ValueError(f"dimension must be one of tp, cp, dp, pp, got {dimension!r}")
    unknown = set(degrees) - {"tp", "pp", "dp", "cp"}
    if unknown:
        raise ValueError(f"unknown degrees {sorted(unknown)}; allowed: tp, pp, dp, cp")
    dense = {"tp": 1, "cp": 1, "ep": 1, "dp": 1, "pp": 1, **degrees}
    check_degrees(world_size, **dense)
    return grid_groups(parse_order(order), dense, [dimension])


def masked_groups(names: list[str], sizes: dict[str, int], members: list[str]) -> list[list[int]]:
    """The groups spanned by the dimensions ``members`` of the grid ``sizes`` laid out in ``names``.

    The grid is ``arange(world).reshape(sizes in reverse order)``, so the last
    axis is the first name (the fastest digit). Moving the member axes to the
    end and flattening the rest gives one row per group: the rows are ordered
    by the other dimensions' coordinates (first name fastest) and each row by
    the members' coordinates (first name fastest), as in Megatron-core.
    """
    return grid_groups(names, sizes, members).tolist()


def grid_groups(names: list[str], sizes: dict[str, int], members: list[str]) -> np.ndarray:
    """:func:`masked_groups` as an ``(n_groups, group_size)`` integer array."""
    shape = [sizes[n] for n in names]
    world = int(np.prod(shape))
    axes_names = names[::-1]  # numpy's axis 0 is the slowest digit
    grid = np.arange(world).reshape([sizes[n] for n in axes_names])
    others = [i for i, n in enumerate(axes_names) if n not in members]
    mine = [i for i, n in enumerate(axes_names) if n in members]
    group_size = int(np.prod([sizes[axes_names[i]] for i in mine]))
    return grid.transpose(others + mine).reshape(-1, group_size)


def coordinates(rank: int, world_size: int, *, order: str = DEFAULT_ORDER, **degrees: int) -> dict:
    """The coordinate of ``rank`` in each dense dimension (tp, cp, dp, pp), e.g. ``{"tp": 1, ...}``."""
    sizes = {"tp": 1, "cp": 1, "ep": 1, "dp": 1, "pp": 1, **degrees}
    check_degrees(world_size, **sizes)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} does not exist; allowed: 0..{world_size - 1}")
    coords, rest = {}, rank
    for name in parse_order(order):
        size = 1 if name == "ep" else sizes[name]
        coords[name] = rest % size
        rest //= size
    coords.pop("ep")
    return coords
