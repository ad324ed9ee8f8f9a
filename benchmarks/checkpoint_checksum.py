"""What verified checkpoints cost: SHA-256 throughput, and its share of a sharded save and load.

    python benchmarks/checkpoint_checksum.py [--mib 256] [--ranks 2]

Prints one table. Row 1 hashes a file of ``--mib`` MiB (the rate every byte of a
checkpoint is read at, once at save and once at load). The other rows train a
GPT for one step on ``--ranks`` gloo processes with ZeRO-1 and Adam, then time
``save_sharded`` and ``load_sharded`` end to end and the part of each spent
hashing (``describe_files`` at save, ``verify_sharded`` at load), on each rank.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import distlab
from distlab.parallel.checkpoint import files


def hash_rate(mib: int) -> tuple[int, float]:
    with tempfile.NamedTemporaryFile() as f:
        block = os.urandom(1 << 20)
        for _ in range(mib):
            f.write(block)
        f.flush()
        files.file_sha256(f.name)  # once to warm the page cache: we time hashing, not the disk
        start = time.perf_counter()
        files.file_sha256(f.name)
        return mib << 20, time.perf_counter() - start


def _save_and_load(rank, world_size, folder, layers):
    import time

    import torch

    from distlab.models import GPT, GPTConfig, gpt_batch
    from distlab.parallel import checkpoint as ckpt
    from distlab.parallel.checkpoint import files
    from distlab.parallel.data import training as T

    torch.set_num_threads(1)
    config = GPTConfig(layers=layers, hidden=256, heads=4)
    trainer = T.build("zero1", GPT(config, seed=0), algorithm="builtin", lr=1e-3)
    T.train_step(trainer, gpt_batch(4, config, seed=0), T.lm_loss)
    spent = {"hash": 0.0, "verify": 0.0}

    def timed(fn, key):
        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start

        return wrapped

    files.describe_files = timed(files.describe_files, "hash")
    ckpt.verify_sharded = timed(ckpt.verify_sharded, "verify")
    start = time.perf_counter()
    ckpt.save_sharded(folder, trainer.model, trainer.optimizer)
    save_s = time.perf_counter() - start
    start = time.perf_counter()
    ckpt.load_sharded(folder, trainer.model, trainer.optimizer)
    load_s = time.perf_counter() - start
    record = files.read_commit(folder)
    size = sum(f["bytes"] for f in record["files"].values())
    return size, save_s, spent["hash"], load_s, spent["verify"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the hashed file (MiB)")
    parser.add_argument("--ranks", type=int, default=2, help="gloo processes for the save/load")
    options = parser.parse_args()
    size, seconds = hash_rate(options.mib)
    print(f"{'what':<34} {'bytes':>12} {'total s':>9} {'hashing s':>10} {'share':>6} {'MB/s':>8}")
    print(
        f"{'SHA-256 of one file (cached)':<34} {size:>12,} {seconds:>9.3f} {seconds:>10.3f} "
        f"{'100%':>6} {size / seconds / 1e6:>8.0f}"
    )
    for layers in (2, 8):
        with tempfile.TemporaryDirectory() as folder:
            rows = distlab.run(
                _save_and_load, options.ranks, args=(f"{folder}/ckpt", layers), timeout=600
            )
        size, save_s, hash_s, load_s, verify_s = max(rows, key=lambda r: r[1])
        for what, total, part in (("save", save_s, hash_s), ("load", load_s, verify_s)):
            label = f"{what}_sharded, GPT {layers} layers"
            print(
                f"{label:<34} {size:>12,} {total:>9.3f} {part:>10.3f} "
                f"{part / total:>6.0%} {size / max(part, 1e-9) / 1e6 / options.ranks:>8.0f}"
            )
    print(
        "(hashing MB/s of a save/load row: bytes / hashing time / ranks, each rank hashes a share)"
    )


if __name__ == "__main__":
    main()
