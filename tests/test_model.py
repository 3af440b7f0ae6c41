"""The three residual layouts against the equations of docs/design.md written out by hand, masking, presets."""

import pytest
import torch
import torch.nn.functional as F

from ladder_train import load_model
from ladder_train.model import IGNORE_INDEX, ModelArgs, Transformer, count_params, flops_per_token, preset_args
from ladder_train.model.modules import apply_rope
from ladder_train.model.transformer import RMSNorm

TINY = dict(vocab_size=97, dim=32, n_layers=3, n_heads=4, ffn_dim=64, max_seq_len=32)


def build(residual, ladder_layers=None, seed=0, **kw):
    torch.manual_seed(seed)
    model = Transformer(ModelArgs(**{**TINY, **kw}, residual=residual, ladder_layers=ladder_layers))
    # norms start at ones; perturb them so a wrong norm would show in the logits
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return model.eval()


def attn(layer, x, model):
    """A_i applied to its own pre-norm input, written with plain tensor ops."""
    a = layer.attention
    b, t, _ = x.shape
    cos, sin = model.rope_cos[:t], model.rope_sin[:t]
    q = (x @ a.wq.weight.T).view(b, t, -1, a.head_dim).transpose(1, 2)
    k = (x @ a.wk.weight.T).view(b, t, -1, a.head_dim).transpose(1, 2)
    v = (x @ a.wv.weight.T).view(b, t, -1, a.head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = (q @ k.transpose(-1, -2)) / a.head_dim**0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
    return out @ a.wo.weight.T


def mlp(layer, x):
    m = layer.mlp
    return (F.silu(x @ m.w_gate.weight.T) * (x @ m.w_up.weight.T)) @ m.w_down.weight.T


def rms(norm, x):
    return norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)


def head(model, r):
    return rms(model.norm, r) @ model.tok_embeddings.weight.T


def by_hand(model, ids):
    """The equations of docs/design.md, layer by layer, following each layer's layout."""
    r = model.tok_embeddings.weight[ids]
    a = m = None
    for layer in model.layers:
        if layer.layout == "standard":
            r = r + attn(layer, rms(layer.attention_norm, r), model)
            r = r + mlp(layer, rms(layer.mlp_norm, r))
        elif layer.layout == "parallel":
            n = rms(layer.attention_norm, r)
            r = r + attn(layer, n, model) + mlp(layer, n)
        else:
            if a is not None:
                r = r + a
            a = attn(layer, rms(layer.attention_norm, r), model)
            if m is not None:
                r = r + m
            m = mlp(layer, rms(layer.mlp_norm, r))
    if a is not None:
        r = r + a + m
    return head(model, r)


IDS = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "residual,ladder_layers,expected",
    [
        ("standard", None, ["standard"] * 3),
        ("parallel", None, ["parallel"] * 3),
        ("ladder", None, ["ladder"] * 3),
        ("ladder", 3, ["ladder"] * 3),
        ("ladder", 1, ["standard", "standard", "ladder"]),
    ],
)
def test_layout_matches_equations(residual, ladder_layers, expected):
    model = build(residual, ladder_layers)
    assert [layer.layout for layer in model.layers] == expected
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), by_hand(model, IDS), atol=1e-5, rtol=1e-5)


def test_ladder_is_not_standard_written_differently():
    """Same weights, different layouts, different function: the tests above would catch a swapped layout."""
    with torch.no_grad():
        std, lad = build("standard")(IDS), build("ladder")(IDS)
    assert (std - lad).abs().max() > 1e-3


def test_ladder_hybrid_three_layers_by_explicit_unrolling():
    """ladder_layers=2 of 3, unrolled by hand: layer 0 standard, then the ladder for layers 1 and 2."""
    model = build("ladder", 2)
    L = model.layers
    with torch.no_grad():
        r = model.tok_embeddings.weight[IDS]
        r = r + attn(L[0], rms(L[0].attention_norm, r), model)
        r = r + mlp(L[0], rms(L[0].mlp_norm, r))
        a1 = attn(L[1], rms(L[1].attention_norm, r), model)
        m1 = mlp(L[1], rms(L[1].mlp_norm, r))  # sees neither a1 nor anything new
        r = r + a1
        a2 = attn(L[2], rms(L[2].attention_norm, r), model)  # lacks m1
        r = r + m1
        m2 = mlp(L[2], rms(L[2].mlp_norm, r))  # lacks a2
        expected = head(model, r + a2 + m2)
        torch.testing.assert_close(model(IDS), expected, atol=1e-5, rtol=1e-5)


def test_one_layer_ladder_is_parallel_with_two_norms():
    ladder = build("ladder", n_layers=1)
    parallel = build("parallel", n_layers=1)
    # copy every shared weight; parallel's single norm takes ladder's attention norm
    parallel.load_state_dict({k: v for k, v in ladder.state_dict().items() if "mlp_norm" not in k})
    with torch.no_grad():
        # with the MLP norm set equal to the attention norm, the two are the same function
        ladder.layers[0].mlp_norm.weight.copy_(ladder.layers[0].attention_norm.weight)
        torch.testing.assert_close(ladder(IDS), parallel(IDS), atol=1e-6, rtol=1e-6)
        # and a different second norm is the only thing that makes them differ
        ladder.layers[0].mlp_norm.weight.mul_(1.3)
        assert (ladder(IDS) - parallel(IDS)).abs().max() > 1e-4


@pytest.mark.parametrize("residual", ["standard", "parallel", "ladder"])
def test_causal_future_tokens_never_change_past_logits(residual):
    model = build(residual)
    changed = IDS.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % 97
    with torch.no_grad():
        before, after = model(IDS), model(changed)
    torch.testing.assert_close(before[:, :7], after[:, :7], atol=1e-6, rtol=1e-6)
    assert (before[:, 7:] - after[:, 7:]).abs().max() > 1e-4


def test_grouped_query_attention_matches_equations():
    model = build("ladder", n_kv_heads=2)
    assert model.layers[0].attention.wk.weight.shape == (2 * 8, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), by_hand(model, IDS), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("residual", ["standard", "parallel", "ladder"])
def test_kv_cache_decode_equals_full_recompute(residual):
    model = build(residual)
    with torch.no_grad():
        full = model(IDS)
        model.setup_kv_cache(batch=2, max_len=16)
        steps = [model(IDS[:, :6], start_pos=0)]
        for pos in range(6, IDS.shape[1]):
            steps.append(model(IDS[:, pos : pos + 1], start_pos=pos))
        model.clear_kv_cache()
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_init_statistics_and_tied_head():
    torch.manual_seed(0)
    args = ModelArgs(vocab_size=4096, dim=256, n_layers=8, n_heads=4, ffn_dim=512, max_seq_len=16)
    model = Transformer(args)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.layers[0].attention.wq.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert model.layers[0].mlp.w_down.weight.std().item() == pytest.approx(0.02 / 4, rel=0.03)  # sqrt(2*8) = 4
    assert model.layers[0].attention.wo.weight.std().item() == pytest.approx(0.02 / 4, rel=0.03)
    assert torch.equal(model.norm.weight, torch.ones(256))
    logits = model(torch.tensor([[1, 2, 3]]))
    assert logits.dtype == torch.float32 and logits.shape == (1, 3, 4096)
    assert sum(p.numel() for p in model.parameters()) == count_params(args)["total"]


def test_meta_init_then_to_empty_equals_eager_init():
    args = ModelArgs(**TINY, residual="ladder")
    eager = Transformer(args)
    torch.manual_seed(3)
    eager.init_weights()
    with torch.device("meta"):
        lazy = Transformer(args)
    lazy.to_empty(device="cpu")
    torch.manual_seed(3)
    lazy.init_weights()
    for (name, a), b in zip(eager.state_dict().items(), lazy.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    torch.testing.assert_close(lazy.rope_cos, eager.rope_cos)


@pytest.mark.parametrize(
    "preset,expected",
    [("1.2B", 1.208e9), ("3.5B", 3.51e9), ("1.5B", 1.55e9), ("4.5B", 4.5e9)],
)
def test_preset_parameter_counts_on_meta(preset, expected):
    args = preset_args(preset, residual="ladder")
    with torch.device("meta"):
        model = Transformer(args)
    n = sum(p.numel() for p in model.parameters())
    assert n == count_params(args)["total"]
    tolerance = 0.01 if preset in ("1.2B", "3.5B") else 0.03  # the paper gives ~1.55B and ~4.5B
    assert abs(n - expected) / expected < tolerance


def test_parallel_layout_has_one_norm_per_layer():
    std, par = count_params(preset_args("1.2B")), count_params(preset_args("1.2B", residual="parallel"))
    assert std["total"] - par["total"] == 40 * 1536


def test_flops_per_token_formula():
    args = preset_args("1.2B")
    n = count_params(args)
    assert flops_per_token(args, 2048) == 6 * (n["non_embedding"] + 49152 * 1536) + 12 * 40 * 1536 * 2048


def test_load_model_preset_and_errors():
    model = load_model("tiny", residual="parallel")
    assert model.args.residual == "parallel" and len(model.layers) == 2
    with pytest.raises(ValueError, match="neither a model preset"):
        load_model("no-such-thing")


@pytest.mark.parametrize("residual", ["standard", "ladder"])
def test_last_only_logits_are_the_last_position_of_the_full_logits(residual):
    model = build(residual)
    with torch.no_grad():
        full, last = model(IDS), model(IDS, last_only=True)
    assert last.shape == (IDS.shape[0], 1, full.shape[-1])
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("residual", ["standard", "ladder"])
def test_labels_give_the_summed_loss_of_the_scored_labels_and_its_gradients(residual):
    """``model(ids, labels=labels)``, the trainer's loss, is the negative log-likelihood of every label that is not
    IGNORE_INDEX, summed, written out from the logits; its gradients are that sum's."""
    model = build(residual)
    labels = torch.randint(0, TINY["vocab_size"], IDS.shape, generator=torch.Generator().manual_seed(1))
    labels[0, :5] = IGNORE_INDEX
    loss = model(IDS, labels=labels)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    scored = labels != IGNORE_INDEX
    by_hand = -model(IDS).log_softmax(-1)[scored].gather(-1, labels[scored][:, None]).sum()
    by_hand.backward()
    assert loss.shape == () and scored.sum() == IDS.numel() - 5
    torch.testing.assert_close(loss, by_hand, atol=1e-5, rtol=1e-6)
    for grad, param in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(grad, param.grad, atol=1e-6, rtol=1e-5)


# the TP sharding rule for KV heads (model/tp_sharding.py): split when TP divides n_kv_heads, replicated above it


@pytest.mark.parametrize(
    "n_heads, n_kv_heads, tp, expected",
    [
        (4, 2, 2, [[0], [1]]),
        (4, 2, 4, [[0], [0], [1], [1]]),  # each KV head on 2 ranks
        (4, 1, 4, [[0], [0], [0], [0]]),
        (8, 4, 2, [[0, 1], [2, 3]]),
        (128, 8, 16, [[r // 2] for r in range(16)]),  # Llama-3.1-405B at TP 16
        (48, 3, 6, [[r // 2] for r in range(6)]),
        (48, 3, 12, [[r // 4] for r in range(12)]),
    ],
)
def test_kv_heads_of_rank_are_the_ones_its_query_heads_use(n_heads, n_kv_heads, tp, expected):
    from ladder_train.model.tp_sharding import check_tp_degree, kv_heads_of_rank, local_kv_heads, shard_index

    args = ModelArgs(dim=16 * n_heads, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn_dim=64 * tp)
    check_tp_degree(args, tp)
    held = [list(kv_heads_of_rank(args, rank, tp)) for rank in range(tp)]
    assert held == expected
    assert all(len(heads) == local_kv_heads(n_kv_heads, tp) for heads in held)
    group = n_heads // n_kv_heads  # query head q uses KV head q // group
    for rank in range(tp):
        query_heads = range(rank * n_heads // tp, (rank + 1) * n_heads // tp)
        assert {q // group for q in query_heads} <= set(held[rank])
        wk_rows = shard_index("layers.0.attention.wk.weight", (n_kv_heads * 16, args.dim), args, rank, tp)[0]
        assert (wk_rows.start, wk_rows.stop) == (held[rank][0] * 16, (held[rank][-1] + 1) * 16)
        wq_rows = shard_index("layers.0.attention.wq.weight", (n_heads * 16, args.dim), args, rank, tp)[0]
        assert (wq_rows.start, wq_rows.stop) == (query_heads.start * 16, query_heads.stop * 16)
        assert shard_index("layers.0.attention_norm.weight", (args.dim,), args, rank, tp) is None


@pytest.mark.parametrize(
    "n_heads, n_kv_heads, tp, message",
    [
        (6, 2, 4, "m: tensor-parallel degree 4 does not divide n_heads=6"),
        (
            12,
            3,
            4,
            "m: tensor-parallel degree 4 is above n_kv_heads=3 (n_heads=12) but not a multiple of it: "
            "the KV heads cannot be replicated evenly",
        ),
        (
            12,
            6,
            4,
            "m: tensor-parallel degree 4 does not divide n_kv_heads=6 (n_heads=12): the KV heads cannot be split evenly",
        ),
    ],
)
def test_tp_degrees_that_cannot_shard_the_heads_are_refused_in_one_line(n_heads, n_kv_heads, tp, message):
    from ladder_train.errors import InputError
    from ladder_train.model.tp_sharding import check_tp_degree

    args = ModelArgs(dim=8 * n_heads, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn_dim=64)
    with pytest.raises(InputError) as err:
        check_tp_degree(args, tp, "m")
    assert str(err.value) == message
