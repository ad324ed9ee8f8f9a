"""Tiny reference models for the course's tests and notebooks: an MLP and a GPT.

Both are deterministic from a seed (weights are drawn from a private RNG
stream, the global one is left alone), run on a laptop CPU in milliseconds,
and use only plain ``nn.Linear``, ``nn.LayerNorm``, ``nn.Embedding`` so a
parallel version (DDP, ZeRO, FSDP, tensor parallel) can be checked against
them weight by weight.

The GPT block is the pre-LayerNorm block of GPT-2/Megatron-LM, written so
the tensors autograd saves are exactly the ones Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", Section
4.1) count, giving sbh(34 + 5as/h) bytes per layer in 16-bit precision:

=========================  =====================================  ===========
tensor saved for backward  saved by                               bytes
=========================  =====================================  ===========
block input                ``ln1`` (LayerNorm)                    2sbh
ln1 output                 ``q``, ``k``, ``v`` (one shared input)  2sbh
Q, K                       QK^T matmul                            4sbh
softmax output             softmax                                2as²b
attention dropout mask     dropout (bool, 1 byte)                 as²b
dropout output, V          attention-over-V matmul                2as²b + 2sbh
merged heads               ``proj`` (output projection)           2sbh
dropout mask after proj    dropout                                sbh
residual stream            ``ln2``                                2sbh
ln2 output                 ``fc1``                                2sbh
GeLU input                 GeLU                                   8sbh
GeLU output                ``fc2``                                8sbh
dropout mask after fc2     dropout                                sbh
=========================  =====================================  ===========

plus LayerNorm's per-row mean and 1/std (2sb floats per norm), which the
paper leaves out. Dropout masks exist only with ``dropout > 0`` in training
mode; the default ``dropout=0.0`` makes forward passes deterministic for
equality tests.

Layer names are stable API (tensor-parallel code shards them):
``attn.q``, ``attn.k``, ``attn.v`` (h -> h, column-parallel by heads),
``attn.proj`` (h -> h, row-parallel), ``mlp.fc1`` (h -> 4h, column-parallel),
``mlp.fc2`` (4h -> h, row-parallel).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from distlab.core.checks import positive_int


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that saves a 1-byte boolean mask for backward, on every device.

    ``F.dropout`` on the CPU multiplies by a mask in the input's dtype (2 bytes
    per element in bf16), while CUDA's fused kernel keeps a bool mask, the
    1 byte per element Korthikanti et al. count; ``torch.native_dropout``
    does the latter everywhere. Same distribution and scaling as ``F.dropout``.
    """
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


def check_tokens(tokens: object, config: GPTConfig, name: str = "tokens") -> None:
    """``ValueError``/``TypeError`` naming the value unless ``tokens`` is a ``(batch, seq)``
    integer tensor with ``seq <= config.seq_len`` and every id in ``[0, config.vocab)``.

    Without it an embedding lookup past its table fails deep inside torch with
    ``index out of range in self``, naming neither the length nor the id. (The id range
    is not checked while ``torch.compile`` traces: reading the minimum would break the graph.)"""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, seq), got {tuple(tokens.shape)}")
    if tokens.shape[1] > config.seq_len:
        raise ValueError(
            f"{name}: sequence length {tokens.shape[1]} exceeds config.seq_len={config.seq_len}: "
            "the position embedding has no row for the later tokens"
        )
    if tokens.numel() and not torch.compiler.is_compiling():
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= config.vocab:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name}: token id {bad} is outside the vocabulary [0, {config.vocab})"
            )


def check_batch(tokens: torch.Tensor, targets: torch.Tensor, config: GPTConfig) -> None:
    """``ValueError`` naming the value unless ``tokens`` and ``targets`` are token ids of
    ``config`` (:func:`check_tokens`) of the same shape."""
    check_tokens(tokens, config)
    check_tokens(targets, config, "targets")
    if targets.shape != tokens.shape:
        raise ValueError(
            f"targets of shape {tuple(targets.shape)} do not match tokens of shape "
            f"{tuple(tokens.shape)}: one target id per token"
        )


class MLP(nn.Module):
    """``sizes[0] -> sizes[1] -> ... -> sizes[-1]``: Linear layers with ReLU
    between them (none after the last). ``MLP((8, 16, 4), seed=0)``."""

    def __init__(self, sizes: tuple[int, ...] = (16, 32, 32, 8), *, seed: int = 0) -> None:
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"sizes needs at least an input and an output size, got {sizes!r}")
        for i, size in enumerate(sizes):
            positive_int(f"sizes[{i}]", size)
        self.sizes = tuple(sizes)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


def mlp_batch(
    batch: int, in_features: int = 16, out_features: int = 8, *, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reproducible regression batch ``(x, y)`` for :class:`MLP` (standard normal)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(positive_int("batch", batch), in_features, generator=gen)
    y = torch.randn(batch, out_features, generator=gen)
    return x, y


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a :class:`GPT`. ``hidden`` must be a multiple of ``heads``."""

    vocab: int = 64
    seq_len: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    dropout: float = 0.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab", "seq_len", "hidden", "heads", "layers"):
            positive_int(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be a multiple of heads={self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention with separate q, k, v projections (see module docstring)."""

    def __init__(self, hidden: int, heads: int, dropout: float, max_seq_len: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, hidden // heads, dropout
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        future = torch.ones(max_seq_len, max_seq_len, dtype=torch.bool).triu(1)
        # Additive mask: adding it saves nothing for backward (masked_fill would save the mask).
        self.register_buffer(
            "mask",
            torch.zeros(max_seq_len, max_seq_len).masked_fill(future, -math.inf),
            persistent=False,
        )

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        """(b, s, heads * d) -> (b, heads, s, d). The head count comes from the projection's
        output, not from ``self.heads``: under tensor parallelism (torch's
        ``parallelize_module`` with q, k, v column-parallel) a rank's projection gives it
        heads / t heads, and the same forward then runs them, as production models do."""
        b, s, _ = t.shape
        return t.view(b, s, -1, self.head_dim).transpose(1, 2)  # (b, a, s, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores + self.mask[:s, :s].to(scores.dtype)
        probs = dropout(scores.softmax(dim=-1), self.dropout, self.training)
        out = (probs @ v).transpose(1, 2).reshape(b, s, -1)  # this rank's heads, side by side
        return dropout(self.proj(out), self.dropout, self.training)


class FeedForward(nn.Module):
    """h -> 4h -> GeLU -> h, then dropout."""

    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(self.fc2(F.gelu(self.fc1(x))), self.dropout, self.training)


class GPTBlock(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(.)): the pre-LN transformer layer."""

    def __init__(self, hidden: int, heads: int, *, dropout: float = 0.0, max_seq_len: int = 2048):
        super().__init__()
        positive_int("hidden", hidden)
        positive_int("heads", heads)
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}")
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, dropout, max_seq_len)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = FeedForward(hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, ``layers`` :class:`GPTBlock` s, a final
    LayerNorm and a language-model head (tied to the token embedding unless
    ``tie_embeddings=False``), initialised as GPT-2 (weights N(0, 0.02), zero
    biases). ``forward(tokens)`` returns logits ``(batch, seq, vocab)``;
    ``loss(tokens, targets)`` the mean cross-entropy."""

    def __init__(self, config: GPTConfig | None = None, *, seed: int = 0) -> None:
        super().__init__()
        self.config = c = config or GPTConfig()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tok = nn.Embedding(c.vocab, c.hidden)
            self.pos = nn.Embedding(c.seq_len, c.hidden)
            self.blocks = nn.ModuleList(
                GPTBlock(c.hidden, c.heads, dropout=c.dropout, max_seq_len=c.seq_len)
                for _ in range(c.layers)
            )
            self.ln_f = nn.LayerNorm(c.hidden)
            self.head = nn.Linear(c.hidden, c.vocab, bias=False)
            for module in self.modules():  # GPT-2's initialisation: N(0, 0.02), zero biases
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        if c.tie_embeddings:
            self.head.weight = self.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        check_tokens(tokens, self.config)
        s = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(s, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def gpt_batch(
    batch: int, config: GPTConfig | None = None, *, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reproducible batch of random tokens and next-token targets for :class:`GPT`."""
    c = config or GPTConfig()
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, c.vocab, (positive_int("batch", batch), c.seq_len + 1), generator=gen)
    return data[:, :-1], data[:, 1:]
