"""What a training run reads and writes: tokenized data in, checkpoints out.

Two calculations a run's design needs beside memory and step time:

* **data loading** (:func:`data_loading`): the cluster consumes ``global_batch x
  seq_len`` tokens every step. Pre-tokenized data stores each token id as a
  fixed-width integer, 2 bytes when the vocabulary has fewer than 65,500
  entries and 4 otherwise (:func:`token_id_bytes`; the rule of Megatron-LM's
  and fairseq's ``indexed_dataset.__best_fitting_dtype``). So the run reads
  tokens/s x bytes per token, spread over its nodes, and the whole token
  budget takes tokens x bytes per token of storage.
* **checkpoints** (:func:`checkpoint_cost`): a resumable checkpoint holds what
  the optimizer needs (with mixed-precision Adam the fp32 master weights and
  Adam's m and v: the ZeRO paper's K = 12 bytes per parameter, Rajbhandari et
  al. 2020, Section 3.1) and, as Megatron-LM and DeepSpeed write it, the
  16-bit model weights beside them: 14 bytes per parameter. Gradients are not
  saved: the step after a restart computes new ones. Every GPU writes its own
  shard at once (a sharded checkpoint, notebook 10), so the write takes
  bytes / (writers x per-writer bandwidth), unless the storage system's total
  bandwidth is lower. Keeping the last ``keep`` checkpoints (at least 2: an
  asynchronous write still in flight when a failure hits is incomplete, and
  the run falls back to the one before) costs keep x the size.

Pure Python; bytes, seconds, bytes per second.
"""

from __future__ import annotations

from dataclasses import dataclass

from distlab.core.checks import positive, positive_int

from .memory import get_recipe

#: Largest vocabulary whose ids are stored in 2 bytes (Megatron-LM's and fairseq's
#: ``__best_fitting_dtype``: uint16 below 65,500, else a 4-byte integer).
UINT16_VOCAB_LIMIT = 65_500


def token_id_bytes(vocab: int) -> int:
    """Bytes per stored token id: 2 if ``vocab`` < 65,500 (uint16), else 4 (Megatron-LM's
    ``indexed_dataset``). LLaMA-2's 32,000 and GPT-2/3's 50,257 fit in 2; Llama 3's 128,256 needs 4."""
    return 2 if positive_int("vocab", vocab) < UINT16_VOCAB_LIMIT else 4


@dataclass(frozen=True)
class DataRate:
    """How fast a run reads tokenized data, and how much it stores (bytes, bytes/s)."""

    tokens_per_s: float
    bytes_per_token: int
    bytes_per_s: float
    nodes: int
    dataset_bytes: float

    @property
    def bytes_per_s_per_node(self) -> float:
        return self.bytes_per_s / self.nodes


def data_loading(
    *,
    global_batch: int,
    seq_len: int,
    step_s: float,
    vocab: int,
    nodes: int = 1,
    tokens: float | None = None,
) -> DataRate:
    """Tokens and bytes of tokenized data the run must read per second.

    tokens/s = ``global_batch`` x ``seq_len`` / ``step_s``; bytes/s = tokens/s x
    :func:`token_id_bytes` (``vocab``), spread evenly over ``nodes`` (each data-parallel
    replica reads its own sequences; the tensor- and pipeline-parallel ranks of a replica
    share them). ``tokens`` (the run's token budget, optional) gives ``dataset_bytes``,
    the storage the tokenized budget takes (0 when not given).
    """
    tokens_per_step = positive_int("global_batch", global_batch) * positive_int("seq_len", seq_len)
    tokens_per_s = tokens_per_step / positive("step_s", step_s)
    width = token_id_bytes(vocab)
    budget = 0.0 if tokens is None else positive("tokens", tokens) * width
    return DataRate(tokens_per_s, width, tokens_per_s * width, positive_int("nodes", nodes), budget)


@dataclass(frozen=True)
class CheckpointCost:
    """One checkpoint's bytes, the time to write it, and the storage the kept ones take."""

    weights_bytes: float
    optimizer_bytes: float
    write_s: float
    keep: int

    @property
    def total(self) -> float:
        """Bytes of one checkpoint."""
        return self.weights_bytes + self.optimizer_bytes

    @property
    def stored_bytes(self) -> float:
        """Bytes on storage for the ``keep`` most recent checkpoints."""
        return self.keep * self.total


def checkpoint_cost(
    n_params: float,
    *,
    writers: int,
    write_bytes_per_s: float,
    storage_bytes_per_s: float | None = None,
    recipe: str = "mixed_adam",
    model_weights: bool = True,
    keep: int = 2,
) -> CheckpointCost:
    """Size and write time of a resumable checkpoint of ``n_params`` parameters.

    Bytes: the optimizer state of ``recipe`` (:data:`distlab.calc.memory.RECIPES`; for
    ``mixed_adam`` 12 per parameter: fp32 master weights, Adam m and v, ZeRO paper Section
    3.1) plus the working weights. A recipe with an fp32 master copy can rebuild the 16-bit
    weights from it, so ``model_weights=False`` leaves them out (12 bytes/param); Megatron-LM
    and DeepSpeed save them too (``True``, the default: 14). A recipe without a master copy
    (``fp32_adam``, ``bf16_adam``, SGD) always saves its weights.

    Time: ``total / min(writers x write_bytes_per_s, storage_bytes_per_s)``: every writer
    (usually every GPU, a sharded checkpoint) writes its share at once, up to what the
    storage system takes in. ``keep`` checkpoints are kept (at least 1).
    """
    psi = positive("n_params", n_params)
    rec = get_recipe(recipe)
    aggregate = positive_int("writers", writers) * positive("write_bytes_per_s", write_bytes_per_s)
    if storage_bytes_per_s is not None:
        aggregate = min(aggregate, positive("storage_bytes_per_s", storage_bytes_per_s))
    if not isinstance(model_weights, bool):
        raise TypeError(f"model_weights must be True or False, got {model_weights!r}")
    save_weights = model_weights or rec.master_bytes == 0
    weights = rec.param_bytes * psi if save_weights else 0.0
    optimizer = rec.optimizer_bytes * psi
    return CheckpointCost(
        weights, optimizer, (weights + optimizer) / aggregate, positive_int("keep", keep)
    )
