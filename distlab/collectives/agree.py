"""Make every rank agree that a collective's inputs match, before moving data.

If rank 0 passes 10 elements and rank 1 passes 12, a naive implementation
hangs (one side waits for bytes that never come) or fails on one rank while
the others wait forever. So every distlab collective first exchanges a small
*header* with every other rank, and all ranks raise the same clear error when
something is off. The header says which collective and algorithm this rank
called (``ring_all_gather``, ``tree_all_reduce``, ...), its reduce op, dtype
and sizes, and any local problem such as a non-contiguous tensor.

Every header has the same width for a given group size, whatever the
collective: ``MAGIC``, the name (as ASCII packed into integers), problem, op,
the number of sizes, then the sizes padded to :func:`header_width`. So two ranks
that call different collectives still exchange matching messages, read each
other's names, and both refuse at once ("rank 0 called ring_all_gather, rank 1
called ring_reduce_scatter") instead of returning wrong data or waiting for a
timeout.

The exchange is a dissemination (Bruck) all-gather of the headers: in round
``k`` rank ``r`` sends what it knows to rank ``r - 2^k`` and receives from
``r + 2^k``; after ``ceil(log2 n)`` rounds everyone has every header. It costs
``ceil(log2 n)`` small messages per collective (Bruck et al. 1997).

:func:`unchecked` skips the exchange inside a block, for one purpose only: measuring what
the check costs (``python benchmarks/collectives_busbw.py --check both``). Inside it a
mismatch is no longer caught: ranks that disagree hang or return wrong data.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from enum import IntEnum

import torch
import torch.distributed as dist

from .buffers import SUPPORTED_DTYPES, Group, global_rank, group_info, op_name
from .traffic import record_header

_OPS = ("sum", "avg", "product", "max", "min")
MAGIC = 0x64697374_6C616221  # "distlab!": a header, not some other message
NAME_WORDS = 6  # a collective's name: up to 48 ASCII characters in 6 int64 words


class Problem(IntEnum):
    """What can be wrong with one rank's inputs; sent to the other ranks as an integer."""

    NONE = 0
    NOT_CONTIGUOUS = 1
    DTYPE = 2
    OP = 3
    INTEGER_AVG = 4
    LIST_LENGTH = 5
    OUTPUT_SIZE = 6
    MIXED_DTYPES = 7
    ROOT = 8


PROBLEMS = {
    Problem.NOT_CONTIGUOUS: "its tensor is not contiguous (call .contiguous() first)",
    Problem.DTYPE: "its dtype is not supported (allowed: "
    + ", ".join(str(d) for d in SUPPORTED_DTYPES)
    + ")",
    Problem.OP: "its reduce op is not supported (allowed: ReduceOp.SUM, AVG, PRODUCT, MAX, MIN)",
    Problem.INTEGER_AVG: "ReduceOp.AVG needs a floating-point tensor (integer averages are not exact)",
    Problem.LIST_LENGTH: "its list of tensors does not have one tensor per rank",
    Problem.OUTPUT_SIZE: "its output tensor has the wrong number of elements",
    Problem.MIXED_DTYPES: "its tensors do not all have the same dtype",
    Problem.ROOT: "its root rank is outside the group",
}


def describe(tensor: torch.Tensor) -> list[int]:
    """dtype code, numel and shape (up to 6 dims) of a tensor, as integers."""
    dtype = dtype_code(tensor)
    shape = list(tensor.shape)[:6]
    return [dtype, tensor.numel(), tensor.dim(), *shape, *([-1] * (6 - len(shape)))]


def dtype_code(tensor: torch.Tensor) -> int:
    """Index of the tensor's dtype in SUPPORTED_DTYPES, or -1."""
    return SUPPORTED_DTYPES.index(tensor.dtype) if tensor.dtype in SUPPORTED_DTYPES else -1


def local_problem(tensors: list[torch.Tensor], op=None, *, reduces: bool = True) -> tuple[int, int]:
    """(:class:`Problem`, op code) for this rank's inputs; ``Problem.NONE`` means fine."""
    try:
        name = op_name(op) if reduces else "sum"
        op_code = _OPS.index(name)
    except ValueError:
        return Problem.OP, -1
    for t in tensors:
        if not t.is_contiguous():
            return Problem.NOT_CONTIGUOUS, op_code
        if t.dtype not in SUPPORTED_DTYPES:
            return Problem.DTYPE, op_code
        if t.dtype != tensors[0].dtype:
            return Problem.MIXED_DTYPES, op_code
        if reduces and name == "avg" and not t.is_floating_point():
            return Problem.INTEGER_AVG, op_code
    return Problem.NONE, op_code


def header_width(n: int) -> int:
    """Number of sizes every header carries in a group of ``n`` ranks.

    The longest header is all-to-all's: a dtype, then ``n`` send and ``n``
    receive sizes; a rooted collective sends a root and a tensor description (10).
    """
    return max(2 * n + 1, 10)


def encode_name(name: str) -> list[int]:
    """``name`` as ``NAME_WORDS`` integers (ASCII, zero-padded); see :func:`decode_name`."""
    raw = name.encode("ascii")[: 8 * NAME_WORDS].ljust(8 * NAME_WORDS, b"\0")
    return [
        int.from_bytes(raw[8 * i : 8 * i + 8], "little", signed=True) for i in range(NAME_WORDS)
    ]


def decode_name(words: list[int]) -> str:
    """The name that :func:`encode_name` packed."""
    raw = b"".join(w.to_bytes(8, "little", signed=True) for w in words)
    return raw.rstrip(b"\0").decode("ascii", errors="replace")


def pack_header(name: str, problem: int, op_code: int, sizes: list[int], n: int) -> list[int]:
    """One rank's fixed-width header: MAGIC, name, problem, op, len(sizes), padded sizes."""
    width = header_width(n)
    if len(sizes) > width:
        raise AssertionError(f"{name}: header of {len(sizes)} sizes exceeds the width {width}")
    return [
        MAGIC,
        *encode_name(name),
        problem,
        op_code,
        len(sizes),
        *sizes,
        *[0] * (width - len(sizes)),
    ]


def unpack_header(row: list[int]) -> tuple[str, int, int, list[int]] | None:
    """(name, problem, op, sizes) of a header, or ``None`` if ``row`` is not a distlab header."""
    if row[0] != MAGIC:
        return None
    name = decode_name(row[1 : 1 + NAME_WORDS])
    problem, op_code, count = row[1 + NAME_WORDS : 4 + NAME_WORDS]
    return name, problem, op_code, row[4 + NAME_WORDS : 4 + NAME_WORDS + count]


def all_gather_headers(header: list[int], group: Group, device: torch.device) -> list[list[int]]:
    """Every rank's ``header`` (all the same length), in rank order, using only send/recv.

    Row ``i`` of ``known`` holds rank ``(rank + i) % n``'s header; in the round at distance
    ``d`` a rank receives rows ``d .. 2d - 1`` straight into place. On gloo the two messages
    of a round are posted one by one (a round costs about half of what the same two messages
    cost through ``batch_isend_irecv``); NCCL needs them in one group call, or a ring of
    ranks each waiting for its receive would deadlock."""
    rank, n = group_info(group)
    # every row starts as this rank's header; rows 1.. are then received over it
    known = torch.tensor([header] * n, dtype=torch.int64, device=device)
    batched = dist.get_backend(group) == "nccl"
    distance = 1
    while distance < n:
        count = min(distance, n - distance)
        incoming = known[distance : distance + count]  # contiguous rows: received in place
        source = global_rank(group, (rank + distance) % n)
        target = global_rank(group, (rank - distance) % n)
        if batched:
            ops = [
                dist.P2POp(dist.irecv, incoming, source, group),
                dist.P2POp(dist.isend, known[:count], target, group),
            ]
            works = dist.batch_isend_irecv(ops)
        else:
            works = [dist.irecv(incoming, source, group), dist.isend(known[:count], target, group)]
        record_header()
        for work in works:
            work.wait()
        distance *= 2
    rows = known.tolist()  # row i holds rank (rank + i) % n
    return [rows[(r - rank) % n] for r in range(n)]


_CHECKING = contextvars.ContextVar("distlab_agreement_checks", default=True)


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Within the block, collectives skip the header exchange (each rank still refuses its
    own bad input). For measuring the check's cost only: ranks that disagree then hang or
    return wrong data. Collectives that need the other ranks' sizes (all-to-all) refuse to
    run unchecked."""
    token = _CHECKING.set(False)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def check_agreement(
    name: str,
    group: Group,
    device: torch.device,
    problem: int,
    op_code: int,
    sizes: list[int],
    *,
    same_on_all_ranks: bool = True,
    explain: Callable[[list[int]], str] | None = None,
) -> list[list[int]]:
    """Exchange headers and raise the same ``ValueError`` on every rank if inputs disagree.

    ``name`` is the collective and algorithm called (``"ring_all_reduce"``): all
    ranks must call the same one. ``sizes`` is whatever must match across ranks
    (dtype, numel, shape), or, with ``same_on_all_ranks=False``, per-peer sizes
    the caller checks itself. Returns all headers as rows ``[problem, op, *sizes]``
    for such extra checks.
    """
    explain = explain or explain_tensor
    rank, n = group_info(group)
    own_row = [problem, op_code, *sizes]  # every rank's row, when they all agree
    if n == 1 or not _CHECKING.get():
        if problem:
            raise ValueError(f"{name}: rank {rank}: {PROBLEMS[problem]}")
        if n > 1 and not same_on_all_ranks:
            raise ValueError(f"{name} needs the other ranks' sizes: it cannot run unchecked()")
        return [own_row] * n
    header = pack_header(name, problem, op_code, sizes, n)
    raw = all_gather_headers(header, group, device)
    if not problem and all(row == header for row in raw):
        # the usual case: every rank sent exactly this rank's header, so every check
        # below passes; the rest of this function only says what differs
        return [own_row] * n
    headers = [unpack_header(row) for row in raw]
    _check_same_collective(name, headers)
    rows = [[problem_r, op_r, *sizes_r] for _, problem_r, op_r, sizes_r in headers]
    for r, row in enumerate(rows):
        if row[0]:
            raise ValueError(f"{name}: rank {r}: {PROBLEMS[Problem(row[0])]}")
    for r, row in enumerate(rows):
        if row[1] != rows[0][1]:
            raise ValueError(
                f"{name}: ranks disagree on the reduce op: rank 0 uses {_OPS[rows[0][1]]}, "
                f"rank {r} uses {_OPS[row[1]]}"
            )
        if same_on_all_ranks and row[2:] != rows[0][2:]:
            raise ValueError(
                f"{name}: tensors differ across ranks: rank 0 has {explain(rows[0][2:])}, "
                f"rank {r} has {explain(row[2:])}"
            )
    return rows


def _check_same_collective(name: str, headers: list) -> None:
    """Raise on every rank unless every rank called collective ``name``."""
    called = [
        h[0] if h is not None else "something that is not a distlab collective" for h in headers
    ]
    if any(c != name for c in called):
        listing = ", ".join(f"rank {r} called {c}" for r, c in enumerate(called))
        raise ValueError(
            f"{name}: ranks called different collectives ({listing}); every rank of the "
            "group must call the same collective with the same algorithm, in the same order"
        )


def _dtype_name(code: int) -> str:
    return str(SUPPORTED_DTYPES[code]) if 0 <= code < len(SUPPORTED_DTYPES) else "unsupported"


def explain_tensor(sizes: list[int]) -> str:
    """Readable form of a :func:`describe` header."""
    dtype, numel, ndim, *shape = sizes[:9]
    return f"dtype {_dtype_name(dtype)}, {numel} elements, shape {tuple(shape[:ndim])}"


def explain_chunks(sizes: list[int]) -> str:
    """Readable form of a ``[dtype, size of block 0, size of block 1, ...]`` header."""
    return f"dtype {_dtype_name(sizes[0])}, block sizes {sizes[1:]}"
