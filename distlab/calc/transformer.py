"""Transformer shapes and their parameter counts; presets for well-known models.

A :class:`ModelSpec` is what the memory, FLOPs and planner calculators need
to know about a decoder-only transformer. Parameter counts are exact for the
architecture described:

* GPT (Radford et al. 2019, as coded in openai/gpt-2's `src/model.py`; Brown
  et al. 2020 keep that architecture): learned position embeddings, biases
  everywhere, LayerNorm (weight and bias), MLP 4h with GeLU, output layer tied
  to the token embedding. One layer has 12h² + 13h parameters.
  Pythia (GPT-NeoX) has the same layers, rotary positions and an untied output.
* LLaMA-2 (Touvron et al. 2023, Section 2.2): rotary positions (no parameters), no
  biases, RMSNorm (weight only), SwiGLU MLP with three h x f matrices,
  untied output layer, grouped-query attention (70B: 8 key/value heads).

Presets (:data:`MODEL_PRESETS`):

* ``1B``: Pythia-1B (Biderman et al. 2023, Table 1: 16 layers, model
  dimension 2048, 8 heads, context 2048; GPT-NeoX vocabulary padded to
  50304, rotary positions, untied output layer, GPT-style layers with
  biases): 1.01B;
* ``7B``, ``13B``, ``70B``: LLaMA-2 (Touvron et al. 2023, Table 1 for
  context 4096 and GQA on 70B; layer sizes from the released model
  configurations: 32/40/80 layers, hidden 4096/5120/8192, heads 32/40/64,
  MLP 11008/13824/28672, vocabulary 32000). The counts come out at
  6.74B, 13.0B and 69.0B;
* ``175B``: GPT-3 (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288,
  96 heads, context 2048): 174.6B.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from distlab.core.checks import choice, divides, positive_int


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (see the module docstring for the two families)."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    ffn_hidden: int | None = None
    kv_heads: int | None = None
    gated_mlp: bool = False
    biases: bool = True
    norm: str = "layernorm"
    learned_positions: bool = True
    tied_embeddings: bool = True
    source: str = ""

    def __post_init__(self) -> None:
        for field_name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            positive_int(field_name, getattr(self, field_name))
        divides("heads", self.heads, "hidden", self.hidden)
        if self.ffn_hidden is not None:
            positive_int("ffn_hidden", self.ffn_hidden)
        if self.kv_heads is not None:
            positive_int("kv_heads", self.kv_heads)
            divides("kv_heads", self.kv_heads, "heads", self.heads)
        choice("norm", self.norm, ("layernorm", "rmsnorm"))

    @property
    def ffn(self) -> int:
        """MLP inner size (4h unless given)."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params_per_layer(self) -> int:
        """Attention + MLP + the layer's two norms."""
        h, f = self.hidden, self.ffn
        kv = (self.kv_heads or self.heads) * self.head_dim
        attention = 2 * h * h + 2 * h * kv + (h + 2 * kv + h if self.biases else 0)
        n_mats = 3 if self.gated_mlp else 2
        mlp = n_mats * h * f + ((f * (n_mats - 1) + h) if self.biases else 0)
        norms = 2 * self._norm_params
        return attention + mlp + norms

    @property
    def embedding_params(self) -> int:
        """Token (and learned position) embeddings, the final norm and an untied output layer."""
        h = self.hidden
        params = self.vocab * h + self._norm_params
        if self.learned_positions:
            params += self.seq_len * h
        if not self.tied_embeddings:
            params += self.vocab * h
        return params

    @property
    def n_params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params

    @property
    def largest_layer_params(self) -> int:
        """The biggest unit FSDP would gather at once: a layer or the token embedding."""
        return max(self.params_per_layer, self.vocab * self.hidden)

    @property
    def _norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def to_dict(self) -> dict:
        return {**asdict(self), "n_params": self.n_params}


def _gpt(name: str, layers: int, hidden: int, heads: int, source: str) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, vocab=50257, seq_len=2048, source=source)


def _pythia(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name,
        layers,
        hidden,
        heads,
        vocab=50304,
        seq_len=2048,
        learned_positions=False,
        tied_embeddings=False,
        source="Pythia, Biderman et al. 2023, Table 1",
    )


def _llama2(name: str, layers: int, hidden: int, heads: int, ffn: int, kv_heads=None) -> ModelSpec:
    return ModelSpec(
        name,
        layers,
        hidden,
        heads,
        vocab=32000,
        seq_len=4096,
        ffn_hidden=ffn,
        kv_heads=kv_heads,
        gated_mlp=True,
        biases=False,
        norm="rmsnorm",
        learned_positions=False,
        tied_embeddings=False,
        source="LLaMA-2, Touvron et al. 2023 (Table 1) and the released configs",
    )


MODEL_PRESETS: dict[str, ModelSpec] = {
    "1B": _pythia("Pythia-1B", 16, 2048, 8),
    "7B": _llama2("LLaMA-2 7B", 32, 4096, 32, 11008),
    "13B": _llama2("LLaMA-2 13B", 40, 5120, 40, 13824),
    "70B": _llama2("LLaMA-2 70B", 80, 8192, 64, 28672, kv_heads=8),
    "175B": _gpt("GPT-3 175B", 96, 12288, 96, "GPT-3, Brown et al. 2020, Table 2.1"),
}


def model_preset(name: str) -> ModelSpec:
    """A preset by name: one of ``1B``, ``7B``, ``13B``, ``70B``, ``175B``."""
    key = name.upper() if isinstance(name, str) else name
    choice("model preset", key, MODEL_PRESETS)
    return MODEL_PRESETS[key]


def gpt_shape_for(n_params: float, *, seq_len: int = 2048, vocab: int = 50257) -> ModelSpec:
    """A GPT shape with about ``n_params`` parameters, when only the size is known.

    Uses the aspect ratio h = 128 l of GPT-3 175B (96 layers, h = 12288) and
    LLaMA-2 7B and 13B, heads of size 128, and 12 l h² ≈ n_params: l is the
    cube root of n_params / (12 x 128²), rounded to a multiple of 4 (at least 4).
    The result's ``n_params`` is exact for the shape it picks, not the input.
    """
    if not isinstance(n_params, (int, float)) or n_params <= 0:
        raise ValueError(f"n_params must be a number > 0, got {n_params!r}")
    layers = max(4, 4 * round((n_params / (12 * 128**2)) ** (1 / 3) / 4))
    hidden = 128 * layers
    return ModelSpec(
        f"GPT-shaped {n_params / 1e9:.3g}B",
        layers,
        hidden,
        hidden // 128,
        vocab=vocab,
        seq_len=seq_len,
        source="GPT shape chosen by distlab.calc.transformer.gpt_shape_for (h = 128 l)",
    )


def rank_parameter_tensors(
    spec: ModelSpec, *, tp: int = 1, pp: int = 1, stage: int = 0
) -> tuple[int, ...]:
    """Element counts of the parameter tensors one rank holds, Megatron-style.

    Tensor parallelism (Shoeybi et al. 2019, Section 3): the column-parallel
    matrices (q, k, v and the MLP's first matrix, or SwiGLU's gate and up)
    are split by output rows together with their biases; the row-parallel
    ones (attention output, MLP's last) by input columns, their biases whole
    on every rank; norms whole. The vocabulary-parallel token embedding holds
    ``ceil(V / tp)`` rows (padded, Megatron's ``make-vocab-size-divisible-by``).
    Pipeline parallelism: stage ``stage`` of ``pp`` holds ``layers / pp``
    layers, the first stage also the embeddings, the last one the final norm
    and the output layer; with tied embeddings and pp > 1 the last stage keeps
    its own copy of the embedding shard (Narayanan et al. 2021, Section 3;
    :class:`distlab.parallel.pipeline.PipelineStage`'s ``tied``).
    The sum over the tp ranks of a stage and the pp stages is :attr:`ModelSpec.n_params`
    plus the vocabulary padding and that extra copy.

    The order is the module's (``model.parameters()`` of distlab's GPT stage:
    embeddings; per layer norm, q, k, v, output projection, norm, MLP, each
    weight before its bias; final norm; output layer), which fixes where
    :func:`distlab.calc.buckets.zero_flat_groups` cuts its buckets.
    """
    t, p = positive_int("tp", tp), positive_int("pp", pp)
    if not isinstance(stage, int) or not 0 <= stage < p:
        raise ValueError(f"stage must be an integer in 0..{p - 1}, got {stage!r}")
    divides("pp", p, "layers", spec.layers)
    h, f = spec.hidden, spec.ffn
    kv = (spec.kv_heads or spec.heads) * spec.head_dim
    for name, size in (("hidden", h), ("key/value width", kv), ("ffn_hidden", f)):
        if size % t:
            raise ValueError(f"tp={t} must divide {name}={size}")
    norm = [h, h] if spec.norm == "layernorm" else [h]

    def linear(weight: int, bias: int) -> list[int]:
        return [weight, bias] if spec.biases else [weight]

    q, kv_pair = linear(h * h // t, h // t), linear(h * kv // t, kv // t) * 2  # column-parallel
    attention = q + kv_pair + linear(h * h // t, h)  # output projection: row-parallel, bias whole
    mlp = linear(f * h // t, f // t) * (2 if spec.gated_mlp else 1)  # fc1 (gate and up)
    mlp += linear(h * f // t, h)  # fc2 (row-parallel)
    tensors = (norm + attention + norm + mlp) * (spec.layers // p)
    embedding = -(-spec.vocab // t) * h  # ceil(V / t) rows of h
    if stage == 0:
        tensors = [embedding] + ([spec.seq_len * h] if spec.learned_positions else []) + tensors
    if stage == p - 1:
        tensors += norm
        if not spec.tied_embeddings or p > 1:
            tensors.append(embedding)
    return tuple(tensors)
