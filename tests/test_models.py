"""distlab.models: seeded, deterministic, CPU-friendly reference models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from distlab.models import GPT, MLP, GPTBlock, GPTConfig, dropout, gpt_batch, mlp_batch


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_seed_determines_weights_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    assert _same(MLP(seed=3), MLP(seed=3))
    assert not _same(MLP(seed=3), MLP(seed=4))
    assert _same(GPT(seed=7), GPT(seed=7))
    assert not _same(GPT(seed=7), GPT(seed=8))
    assert torch.equal(torch.random.get_rng_state(), before)


def test_batches_are_reproducible():
    x1, y1 = mlp_batch(4, 16, 8, seed=5)
    x2, y2 = mlp_batch(4, 16, 8, seed=5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    tokens, targets = gpt_batch(3, GPTConfig(vocab=50, seq_len=12), seed=2)
    assert tokens.shape == targets.shape == (3, 12)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])  # next-token targets
    assert int(tokens.max()) < 50


def test_mlp_shapes_and_backward():
    model = MLP((16, 32, 8), seed=0)
    x, y = mlp_batch(5, 16, 8)
    out = model(x)
    assert out.shape == (5, 8)
    torch.nn.functional.mse_loss(out, y).backward()
    assert all(p.grad is not None for p in model.parameters())
    assert [tuple(layer.weight.shape) for layer in model.layers] == [(32, 16), (8, 32)]


def test_gpt_forward_loss_and_tied_embeddings():
    config = GPTConfig(vocab=64, seq_len=16, hidden=32, heads=4, layers=2)
    model = GPT(config, seed=0)
    tokens, targets = gpt_batch(2, config)
    assert model(tokens).shape == (2, 16, 64)
    loss = model.loss(tokens, targets)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.2)
    loss.backward()
    assert model.head.weight is model.tok.weight
    # a tied weight is one parameter: counted once
    names = [n for n, _ in model.named_parameters()]
    assert "head.weight" not in names
    untied = GPT(GPTConfig(tie_embeddings=False), seed=0)
    assert untied.head.weight is not untied.tok.weight


def test_gpt_is_causal():
    model = GPT(GPTConfig(vocab=32, seq_len=8, hidden=16, heads=2, layers=1), seed=0).eval()
    tokens, _ = gpt_batch(1, model.config)
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 32
    a, b = model(tokens), model(changed)
    assert torch.allclose(a[0, :5], b[0, :5])
    assert not torch.allclose(a[0, 5:], b[0, 5:])


def test_train_mode_is_deterministic_without_dropout():
    model = GPT(seed=1).train()
    tokens, _ = gpt_batch(2)
    assert torch.equal(model(tokens), model(tokens))


def test_layer_names_tensor_parallel_code_relies_on():
    block = GPTBlock(32, 4)
    shapes = {n: tuple(p.shape) for n, p in block.named_parameters() if n.endswith("weight")}
    assert shapes == {
        "ln1.weight": (32,),
        "attn.q.weight": (32, 32),
        "attn.k.weight": (32, 32),
        "attn.v.weight": (32, 32),
        "attn.proj.weight": (32, 32),
        "ln2.weight": (32,),
        "mlp.fc1.weight": (128, 32),
        "mlp.fc2.weight": (32, 128),
    }


def test_dropout_drops_and_rescales():
    x = torch.ones(100_000)
    y = dropout(x, 0.25, True)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(0.75, abs=0.01)
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.75))
    assert dropout(x, 0.25, False) is x


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: GPTConfig(hidden=30, heads=4), "hidden=30 must be a multiple of heads=4"),
        (lambda: GPTConfig(layers=0), "layers must be"),
        (lambda: GPTConfig(dropout=1.0), "dropout"),
        (lambda: MLP((16,)), "at least an input and an output"),
        (lambda: MLP((16, 0, 8)), r"sizes\[1\]"),
        (lambda: GPTBlock(30, 4), "hidden=30"),
        (lambda: mlp_batch(0), "batch"),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_sequence_longer_than_config_is_an_error():
    model = GPT(GPTConfig(seq_len=8))
    with pytest.raises(ValueError, match="exceeds config.seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
