"""``init()``: the same worker code under ``torchrun`` instead of ``run``.

torchrun starts the processes itself and tells each one who it is through environment
variables; ``init`` reads them and opens the process group, so ``fn(rank, world_size)``
runs unchanged. torch is imported only when ``init`` is called, so that
``import distlab.launch`` stays cheap.
"""

from __future__ import annotations

import os
from datetime import timedelta


def init(backend: str | None = None, timeout: float = 1800.0) -> tuple[int, int]:
    """Initialise the process group from ``torchrun``'s environment; return ``(rank, world_size)``.

    torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
    ``MASTER_PORT``. The backend defaults to NCCL when CUDA is available (each
    process then uses GPU ``LOCAL_RANK``) and to gloo otherwise.
    """
    import torch
    import torch.distributed as dist

    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f"distlab.init() reads the environment set by torchrun, but {missing} "
            "are not set. Start the script with `torchrun --nproc-per-node N script.py`, "
            "or use distlab.run(fn, N) from Python."
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    kwargs = {}
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout), **kwargs)
    return dist.get_rank(), dist.get_world_size()
