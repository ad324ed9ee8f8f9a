"""How gradients are cut into buckets: the rules distlab's DDP and ZeRO apply, as numbers.

PyTorch's DDP (Li et al. 2020, Section 3.2.2) fills a bucket until it holds at
least ``bucket_cap_mb`` MiB and then starts the next; :mod:`distlab.parallel.comm.buckets`
and :class:`distlab.parallel.zero.optimizer.ZeroOptimizer` cut parameters with
:func:`bucket_indices`, and :func:`zero_flat_groups` gives the padded flat groups
ZeRO builds from them (which :mod:`distlab.calc.three_d` counts). Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.core.checks import positive, positive_int

#: torch DDP's default ``bucket_cap_mb`` (torch/nn/parallel/distributed.py), used by
#: distlab's DDP and ZeRO too; PyTorch's "MB" is a MiB (it multiplies by 1024 * 1024)
DEFAULT_BUCKET_CAP_MB = 25.0
BYTES_PER_MB = 2**20


def bucket_indices(sizes_bytes: Sequence[float], cap_bytes: float) -> list[list[int]]:
    """Cut tensors of ``sizes_bytes`` (in the order their gradients are expected) into
    buckets: lists of indices.

    PyTorch's rule (``torch.distributed._compute_bucket_assignment_by_size``
    with one size limit; Li et al. 2020, Section 3.2.2): add tensors to the
    current bucket until it holds at least ``cap_bytes``, then start a new one;
    so a bucket exceeds the cap by less than its last tensor.
    """
    if not cap_bytes > 0:
        raise ValueError(f"bucket cap must be > 0 bytes, got {cap_bytes!r}")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for i, n in enumerate(sizes_bytes):
        current.append(i)
        size += n
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def zero_flat_groups(
    tensor_elements: Sequence[int],
    *,
    dp: int,
    bytes_per_element: int,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
) -> list[int]:
    """Padded sizes (elements) of the flat groups :class:`distlab.parallel.zero.optimizer.ZeroOptimizer`
    builds from parameters of ``tensor_elements`` (in ``model.parameters()`` order).

    The parameters are cut into buckets in reverse order (:func:`bucket_indices`,
    ``bucket_cap_mb`` MiB), and each bucket's Ψ_g elements are padded to
    ``dp * ceil(Ψ_g / dp)``, so that the dp shards are equal
    (:mod:`distlab.parallel.zero.flat`; Rajbhandari et al. 2020, Section 5).
    """
    k = positive_int("dp", dp)
    bpe = positive_int("bytes_per_element", bytes_per_element)
    backwards = list(tensor_elements)[::-1]
    cap = positive("bucket_cap_mb", bucket_cap_mb) * BYTES_PER_MB
    groups = bucket_indices([n * bpe for n in backwards], cap)
    return [-(-sum(backwards[i] for i in g) // k) * k for g in groups]
