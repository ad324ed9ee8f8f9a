"""Which communication a sharded matmul needs, and what each choice costs.

``A[I, J] @ B[J, K] = C[I, K]`` with ``J`` the contracting dimension. On a mesh with one
axis ``x`` of ``n`` ranks, the shardings of the two operands fall in one of four cases
(the classification of "How to Scale Your Model", part 3):

``local``              neither operand is split along ``J``, and ``x`` does not split both
                       ``I`` and ``K``: each rank multiplies its blocks, nothing is sent.
                       ``A[I_x, J] @ B[J, K] = C[I_x, K]`` is data parallelism,
                       ``A[I, J] @ B[J, K_x] = C[I, K_x]`` a column-parallel layer.
``one-contracting``    one operand is split along ``J``, the other has ``J`` whole. Either
                       *gather first* (all-gather the split operand along ``J``, then
                       multiply: ``|A|`` bytes of payload), or *reduce after* (take your
                       ``J`` slice of the whole operand for free, multiply into a partial sum
                       of all of ``C``, then all-reduce ``|C|``, or reduce-scatter it when
                       ``C`` may stay split). Which is cheaper depends on ``|A|`` against
                       ``|C|``: ``I J`` against ``2 I K`` for an all-reduce.
``both-contracting``   both operands split along ``J`` by ``x``: each rank's product is a
                       partial sum; all-reduce for a whole ``C``, reduce-scatter (half the
                       bytes) for ``C[I_x, K]`` or ``C[I, K_x]``. A row-parallel layer.
``same-axis-outputs``  ``x`` splits ``I`` of ``A`` and ``K`` of ``B``: the blocks a rank holds
                       give only a diagonal block of ``C``. One operand must be gathered
                       first, best the smaller: ``C[I, K_x]`` after gathering ``A``,
                       ``C[I_x, K]`` after gathering ``B``.

Every plan here is a list of :class:`Step` s; a communication step carries the
:class:`~distlab.calc.volume.CommPart` that counts its bytes per rank (ring algorithms:
all-gather and reduce-scatter ``(n-1)/n`` of the whole buffer, all-reduce ``2 (n-1)/n``).
:func:`plans` lists every way to reach an output, :func:`best_plan` the cheapest, and
:mod:`distlab.parallel.sharding.execute` runs a plan on real processes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from distlab.calc.volume import CommPart
from distlab.core.checks import positive_int

from .notation import Sharded, one_axis_mesh, sharded

CASES = {
    "local": "no operand split along the contracting dimension: multiply the blocks",
    "one-contracting": "one operand split along the contracting dimension: gather it first, "
    "or slice the other and reduce the partial sums after",
    "both-contracting": "both split along the contracting dimension: partial sums, "
    "all-reduce (C whole) or reduce-scatter (C split)",
    "same-axis-outputs": "one mesh axis splits both non-contracting dimensions: gather one "
    "operand first",
}
COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter")


@dataclass(frozen=True)
class Step:
    """One step of a plan: ``op`` on array ``tensor`` (along dimension ``dim``), giving ``result``.

    ``op``: ``"all_gather"``, ``"all_reduce"``, ``"reduce_scatter"`` (communication),
    ``"slice"`` (keep this rank's block of a whole dimension: free) or ``"matmul"``.
    ``part`` counts a communication step's bytes per rank (None for the free steps).
    """

    op: str
    tensor: str
    dim: str | None
    result: Sharded
    part: CommPart | None = None

    def __str__(self) -> str:
        if self.op == "matmul":
            return f"multiply -> {self.result}"
        along = f" along {self.dim}" if self.dim else ""
        return f"{self.op} {self.tensor}{along} -> {self.result}"


@dataclass(frozen=True)
class Plan:
    """A sharded matmul from ``a`` and ``b`` to ``out``: its case and steps, in order."""

    case: str
    a: Sharded
    b: Sharded
    out: Sharded
    steps: tuple[Step, ...]

    @property
    def communication(self) -> list[tuple[str, str]]:
        """The collectives in order, as (collective, array name): ``[("all_gather", "A")]``."""
        return [(s.op, s.tensor) for s in self.steps if s.part is not None]

    @property
    def bytes_per_rank(self) -> float:
        """Bytes one rank sends: the sum of the steps' :class:`CommPart` counts."""
        return sum(s.part.bytes_sent for s in self.steps if s.part is not None)

    @property
    def name(self) -> str:
        """``"all_gather A, then multiply"``; ``"multiply, no communication"``."""
        words, multiplied = [], False
        for s in self.steps:
            if s.op == "matmul":
                words.append("multiply")
                multiplied = True
            elif s.part is not None:
                along = f" along {s.dim}" if s.dim else ""
                words.append(f"{s.op} {s.tensor}{along}" + ("" if multiplied else ", then"))
        text = " ".join(words).replace("multiply all", "multiply, then all")
        text = text.replace("multiply reduce", "multiply, then reduce")
        return text if self.communication else "multiply, no communication"

    def __str__(self) -> str:
        return f"{self.a} @ {self.b} = {self.out}: {self.name}"


def matmul_dims(a: Sharded, b: Sharded) -> tuple[str, str, str]:
    """(I, J, K): ``a`` is ``[I, J]``, ``b`` is ``[J, K]``; ValueError for other shapes."""
    if len(a.dims) != 2 or len(b.dims) != 2:
        raise ValueError(f"{a} @ {b}: both operands must have two dimensions")
    (i, j), (j2, k) = a.names, b.names
    if j != j2 or i == k or i == j or k == j:
        raise ValueError(
            f"{a} @ {b}: write the product as A[I, J] @ B[J, K], the contracting dimension "
            f"last in the first operand and first in the second (got {j!r} and {j2!r})"
        )
    if a.name == b.name:
        raise ValueError(f"{a} @ {b}: the two operands need different names")
    return i, j, k


def matmul_case(a: str | Sharded, b: str | Sharded) -> str:
    """The case (a key of :data:`CASES`) of ``a @ b``, from the shardings alone."""
    a, b = sharded(a), sharded(b)
    i, j, k = matmul_dims(a, b)
    ja, jb = a.axis_of(j), b.axis_of(j)
    if ja is not None and jb is not None:
        if ja != jb:
            raise ValueError(f"{a} @ {b}: J is split over two mesh axes, {ja!r} and {jb!r}")
        return "both-contracting"
    if ja is not None or jb is not None:
        return "one-contracting"
    if a.axis_of(i) is not None and a.axis_of(i) == b.axis_of(k):
        return "same-axis-outputs"
    return "local"


def plans(
    a: str | Sharded,
    b: str | Sharded,
    sizes: dict[str, int],
    mesh: dict[str, int],
    *,
    out: str | Sharded | None = None,
    bytes_per_element: int = 4,
) -> list[Plan]:
    """Every way to compute ``a @ b`` on a one-axis ``mesh``, cheapest first.

    Before the multiply, each operand is kept, all-gathered (made whole) or sliced along the
    contracting dimension to match the other (free); after it, a partial sum is all-reduced
    or reduce-scattered, and a result that is split where ``out`` wants it whole is
    all-gathered (one that is whole where ``out`` wants it split is sliced, free). With
    ``out`` None every output the operands lead to is listed (named ``C``). A plan whose
    collectives include another's with the same output is left out (it only adds bytes).
    """
    a, b = sharded(a), sharded(b)
    i, j, k = matmul_dims(a, b)
    axis, n = one_axis_mesh(mesh)
    for operand in (a, b):
        for d in operand.dims:
            if d.mesh_axis not in (None, axis):
                raise ValueError(f"{operand}: mesh axis {d.mesh_axis!r} is not in the mesh {mesh}")
    bytes_per_element = positive_int("bytes_per_element", bytes_per_element)
    context = _Context(sizes, mesh, n, bytes_per_element)
    target = None if out is None else sharded(out)
    if target is not None and target.names != (i, k):
        raise ValueError(f"out {target}: its dimensions must be ({i}, {k}), those of {a} @ {b}")
    out_name = target.name if target is not None else "C"
    case = matmul_case(a, b)
    found: dict[tuple, Plan] = {}
    for before_a, before_b in itertools.product(
        _operand_options(a, b, j, axis, context), _operand_options(b, a, j, axis, context)
    ):
        a2 = before_a[-1].result if before_a else a
        b2 = before_b[-1].result if before_b else b
        if a2.axis_of(j) != b2.axis_of(j):
            continue
        i_axis, k_axis = a2.axis_of(i), b2.axis_of(k)
        if i_axis is not None and i_axis == k_axis:
            continue
        product = Sharded(out_name, (a2.dims[0], b2.dims[1]))
        matmul = Step("matmul", out_name, j, product)
        partial = a2.axis_of(j) is not None
        for after in _after_options(product, partial, target, i, k, axis, context):
            steps = (*before_a, *before_b, matmul, *after)
            plan = Plan(case, a, b, after[-1].result if after else product, steps)
            key = (str(plan.out), tuple((s.op, s.tensor, s.dim) for s in steps if s.part))
            if key not in found or len(steps) < len(found[key].steps):
                found[key] = plan
    kept = [p for p in found.values() if not _adds_to_another(p, found.values())]
    return sorted(kept, key=lambda p: (p.bytes_per_rank, len(p.steps), str(p.out)))


def best_plan(
    a: str | Sharded,
    b: str | Sharded,
    sizes: dict[str, int],
    mesh: dict[str, int],
    *,
    out: str | Sharded | None = None,
    bytes_per_element: int = 4,
) -> Plan:
    """The plan of :func:`plans` that sends the fewest bytes per rank."""
    options = plans(a, b, sizes, mesh, out=out, bytes_per_element=bytes_per_element)
    if not options:
        raise ValueError(f"no plan computes {a} @ {b} as {out}")
    return options[0]


def plan_with(
    communication: list[tuple[str, str]],
    a: str | Sharded,
    b: str | Sharded,
    sizes: dict[str, int],
    mesh: dict[str, int],
    *,
    out: str | Sharded,
    bytes_per_element: int = 4,
) -> Plan:
    """The plan to ``out`` whose collectives are ``communication`` (``[("all_gather", "A")]``,
    ``[]`` for none); ValueError lists the collectives of every plan that reaches ``out``.

    :func:`plans` lists an all-reduce once; a reduce-scatter of an array followed by an
    all-gather of the same array is that all-reduce in two calls (the ring all-reduce is
    exactly these two phases, and sends the same bytes), so it is accepted too: the plan's
    all-reduce becomes a reduce-scatter and an all-gather along the array's first dimension."""
    options = plans(a, b, sizes, mesh, out=out, bytes_per_element=bytes_per_element)
    wanted = [tuple(c) for c in communication]
    for plan in options:
        if plan.communication == wanted:
            return plan
    for at in range(len(wanted) - 1):
        first, then = wanted[at], wanted[at + 1]
        if len(first) == 2 and first[0] == "reduce_scatter" and then == ("all_gather", first[1]):
            merged = [*wanted[:at], ("all_reduce", first[1]), *wanted[at + 2 :]]
            for plan in options:
                if plan.communication == merged:
                    return _all_reduce_in_two_calls(plan, one_axis_mesh(mesh)[0])
    listed = "; ".join(str(p.communication) for p in options)
    raise ValueError(
        f"{a} @ {b} = {out}: no plan has the collectives {wanted}; the plans are: {listed}"
    )


def _all_reduce_in_two_calls(plan: Plan, axis: str) -> Plan:
    """``plan`` with its all-reduce played as a reduce-scatter along the result's first
    dimension and an all-gather back: the same result, the same bytes."""
    steps: list[Step] = []
    for s in plan.steps:
        if s.op != "all_reduce":
            steps.append(s)
            continue
        dim, half = s.result.names[0], s.part.payload_bytes
        split = s.result.with_axis(dim, axis)
        size = s.part.group_size
        steps += [
            Step("reduce_scatter", s.tensor, dim, split,
                 CommPart(f"reduce_scatter {s.tensor}", "reduce_scatter", size, half)),
            Step("all_gather", s.tensor, dim, s.result,
                 CommPart(f"all_gather {s.tensor}", "all_gather", size, half)),
        ]  # fmt: skip
    return Plan(plan.case, plan.a, plan.b, plan.out, tuple(steps))


@dataclass(frozen=True)
class _Context:
    sizes: dict[str, int]
    mesh: dict[str, int]
    n: int
    bytes_per_element: int

    def part(self, op: str, buffer: Sharded) -> CommPart:
        """The collective ``op`` over the mesh on ``buffer`` (the whole buffer, as CommPart
        counts it: an all-gather's output, a reduce-scatter's input)."""
        payload = buffer.elements(self.sizes, self.mesh) * self.bytes_per_element
        return CommPart(f"{op} {buffer.name}", op, self.n, payload)


def _operand_options(x: Sharded, other: Sharded, j: str, axis: str, ctx: _Context) -> list:
    """Steps before the multiply for operand ``x``: keep it; gather its split dimension; slice
    its whole ``J`` to match ``other``'s split ``J`` (free); or gather, then slice."""
    options: list[tuple[Step, ...]] = [()]
    for dim in x.sharded_dims():
        whole = x.with_axis(dim, None)
        gather = Step("all_gather", x.name, dim, whole, ctx.part("all_gather", whole))
        options.append((gather,))
        if dim != j and _can_slice(whole, other, j, axis):
            options.append((gather, Step("slice", x.name, j, whole.with_axis(j, axis))))
    if _can_slice(x, other, j, axis):
        options.append((Step("slice", x.name, j, x.with_axis(j, axis)),))
    return options


def _can_slice(x: Sharded, other: Sharded, j: str, axis: str) -> bool:
    """``x`` can take its block of ``J`` to match ``other``: its ``J`` is whole, ``other``'s is
    split over ``axis``, and ``axis`` splits nothing else of ``x``."""
    free = axis not in (d.mesh_axis for d in x.dims)
    return x.axis_of(j) is None and other.axis_of(j) == axis and free


def _after_options(product, partial, target, i, k, axis, ctx) -> list[tuple[Step, ...]]:
    """Steps after the multiply: reduce a partial sum, then make the result ``target``."""
    reduced: list[tuple[Step, ...]] = [()]
    if partial:
        reduced = [
            (Step("all_reduce", product.name, None, product, ctx.part("all_reduce", product)),)
        ]
        for dim in (i, k):
            scatter = ctx.part("reduce_scatter", product)
            split = product.with_axis(dim, axis)
            reduced.append((Step("reduce_scatter", product.name, dim, split, scatter),))
    if target is None:
        return reduced
    return [
        s for s in (_to_target(r, product, target, (i, k), ctx) for r in reduced) if s is not None
    ]


def _to_target(steps, product, target, dims, ctx) -> tuple[Step, ...] | None:
    """``steps`` followed by what turns their result into ``target`` (gather where it must be
    whole, slice where it may be split); None if that undoes a reduce-scatter (an all-reduce
    in two calls, listed already)."""
    current, steps = (steps[-1].result if steps else product), list(steps)
    for dim in dims:  # gathers first: a mesh axis may move from one dimension to the other
        if current.axis_of(dim) not in (None, target.axis_of(dim)):
            if steps and steps[-1].op == "reduce_scatter" and steps[-1].dim == dim:
                return None
            current = current.with_axis(dim, None)
            steps.append(
                Step("all_gather", current.name, dim, current, ctx.part("all_gather", current))
            )
    for dim in dims:
        if current.axis_of(dim) != target.axis_of(dim):
            current = current.with_axis(dim, target.axis_of(dim))
            steps.append(Step("slice", current.name, dim, current))
    return tuple(steps) if current == target else None


def _comm_keys(plan: Plan) -> set[tuple]:
    return {(s.op, s.tensor, s.dim) for s in plan.steps if s.part is not None}


def _adds_to_another(plan: Plan, others) -> bool:
    """True if another plan with the same output uses a strict subset of its collectives."""
    mine = _comm_keys(plan)
    return any(other.out == plan.out and _comm_keys(other) < mine for other in others)
