"""The desync layout on one device (model/desync.py): the t emulated streams compute what t tensor-parallel ranks
compute, written out here rank by rank with each rank's weight slices (model/tp_sharding.py), for the authors' 2x
and 4x patterns, a hybrid and grouped-query attention above and below t; which modules reduce; the config checks.
TP inference over gloo: tests/test_inference_desync.py."""

import pytest
import torch
import torch.nn.functional as F

from ladder_train.config import ConfigError, load_config
from ladder_train.errors import InputError
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.desync import reduce_schedule
from ladder_train.model.modules import apply_rope
from ladder_train.model.shape_checks import check_model_fields
from ladder_train.model.tp_sharding import check_tp_degree, shard_index
from ladder_train.model.transformer import RMSNorm

SHAPE = dict(vocab_size=61, dim=32, n_layers=4, n_heads=4, ffn_dim=48, max_seq_len=24)


def make_model(**fields):
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**{**SHAPE, "residual": "desync", **fields}))
    with torch.no_grad():  # norms start at ones; perturb them so a norm applied to the wrong stream shows
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return model


def rank_by_rank(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """The logits t TP ranks compute, each holding only its slices: the authors' loop, one rank at a time."""
    args, state = model.args, model.state_dict()
    t = args.desync_tp

    def local(name, rank):
        index = shard_index(name, state[name].shape, args, rank, t)
        return state[name] if index is None else state[name][index]

    def norm(x, name):
        x32 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + args.norm_eps)
        return state[name] * x32

    def attention(x, prefix, rank):
        batch, seq, _ = x.shape
        q, k, v = (F.linear(x, local(f"{prefix}.w{n}.weight", rank)) for n in "qkv")
        q, k, v = (y.view(batch, seq, -1, args.head_dim).transpose(1, 2) for y in (q, k, v))
        cos, sin = model.rope_cos[:seq], model.rope_sin[:seq]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, -1)
        return F.linear(out, local(f"{prefix}.wo.weight", rank))

    def mlp(x, prefix, rank):
        gate, up = (
            F.linear(x, local(f"{prefix}.w_gate.weight", rank)),
            F.linear(x, local(f"{prefix}.w_up.weight", rank)),
        )
        return F.linear(F.silu(gate) * up, local(f"{prefix}.w_down.weight", rank))

    x = state["tok_embeddings.weight"][ids]
    streams = [x] * t
    for i, (layout, reduces) in enumerate(zip(args.layer_layouts(), args.layer_reduces(), strict=True)):
        steps = ((attention, "attention", "attention_norm"), (mlp, "mlp", "mlp_norm"))
        for (module, name, norm_name), reduce in zip(steps, reduces, strict=True):
            partials = [
                module(norm(streams[r], f"layers.{i}.{norm_name}.weight"), f"layers.{i}.{name}", r) for r in range(t)
            ]
            if layout == "standard" or reduce:  # all_reduce(partial + x_rank / t); standard: x + all_reduce(partial)
                total = sum(p + s / t for p, s in zip(partials, streams, strict=True))
                streams = [total] * t
            else:
                streams = [s + p for s, p in zip(streams, partials, strict=True)]
    assert all(torch.equal(s, streams[0]) for s in streams)  # the last module re-synchronised the ranks
    return F.linear(norm(streams[0], "norm.weight"), state["tok_embeddings.weight"])


CASES = {
    "2x, t=2": dict(desync_tp=2),
    "4x, t=2": dict(desync_tp=2, desync_reduce_every=4),
    "none but the last, t=4": dict(desync_tp=4, desync_pattern=["none"] * 4),
    "hybrid: 2 standard + 2 desync": dict(desync_tp=2, desync_layers=2),
    "explicit pattern, t=2 splitting 2 KV heads": dict(
        desync_tp=2, n_kv_heads=2, desync_pattern=["attention", "both", "none", "mlp"]
    ),
    "t=4 above 2 kv heads (replicated)": dict(desync_tp=4, n_kv_heads=2),
    "t=2 above 1 kv head": dict(desync_tp=2, n_kv_heads=1, desync_reduce_every=3),
}


@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_emulated_streams_compute_what_the_ranks_compute(fields):
    model = make_model(**fields)
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), rank_by_rank(model, ids), atol=2e-5, rtol=1e-5)


def test_the_layout_changes_the_function():
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(3))
    desync = make_model(desync_tp=2)
    standard = Transformer(ModelArgs(**SHAPE))
    standard.load_state_dict(desync.state_dict())
    every_module = make_model(desync_tp=2, desync_reduce_every=1)
    with torch.no_grad():
        # reducing every module is the standard layout: x + sum(partials) = all_reduce(partial + x / t)
        torch.testing.assert_close(every_module(ids), standard(ids), atol=2e-5, rtol=1e-5)
        assert (desync(ids) - standard(ids)).abs().max() > 1e-2  # the 2x pattern is a different model


def test_cached_decode_equals_the_full_forward():
    model = make_model(desync_tp=4, n_kv_heads=2)  # the cache holds one KV head per emulated stream
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(ids)
        model.setup_kv_cache(2, 16)
        assert model.layers[0].attention.kv_cache.k.shape[1] == 4
        steps = [model(ids[:, :7], 0)] + [model(ids[:, p : p + 1], torch.tensor(p)) for p in range(7, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=2e-5, rtol=1e-5)


@pytest.mark.slow  # compiles
def test_gradients_reach_every_weight_and_compile_traces_it_whole():
    model = make_model(desync_tp=2, desync_reduce_every=4)
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(5))
    model(ids).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids), atol=2e-5, rtol=1e-5)


def test_which_modules_reduce():
    assert reduce_schedule(3, 2, None) == [(False, True)] * 3  # 2x: each MLP
    assert reduce_schedule(4, 4, None) == [(False, False), (False, True)] * 2  # 4x: every other MLP
    assert reduce_schedule(3, 1, None) == [(True, True)] * 3
    assert reduce_schedule(3, 100, None) == [(False, False), (False, False), (False, True)]  # the last always
    assert reduce_schedule(2, 2, ["attention", "none"]) == [(True, False), (False, True)]
    args = ModelArgs(**SHAPE, residual="desync", desync_tp=2, desync_layers=1)
    assert args.layer_layouts() == ["standard"] * 3 + ["desync"]
    assert args.layer_reduces() == [(True, True)] * 3 + [(False, True)]


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.residual=desync", "key 'model.desync_tp'=None: a desync model needs the tensor-parallel degree"),
        ("model.residual=desync model.desync_tp=3", "key 'model.desync_tp'=3: does not divide key 'model.n_heads'=4"),
        ("model.desync_tp=2", "key 'model.desync_tp'=2: only a desync model has it"),
        ("model.residual=desync model.desync_tp=2 model.desync_reduce_every=0", "key 'model.desync_reduce_every'=0"),
        ("model.residual=desync model.desync_tp=2 model.desync_layers=9", "key 'model.desync_layers'=9: must be"),
        (
            "model.residual=desync model.desync_tp=2 model.desync_pattern=[mlp]",
            "must list one entry per desync layer (2)",
        ),
        ("model.residual=desync model.desync_tp=2 model.desync_pattern=[mlp,all]", "'all' is not one of none, "),
    ],
)
def test_bad_desync_settings_are_one_line_naming_the_key(override, message):
    shape = "model.dim=32 model.n_layers=2 model.n_heads=4 model.ffn_dim=64"
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*shape.split(), *override.split()])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_model_folder_with_bad_desync_fields_is_refused_and_other_tp_degrees_too():
    fields = {**SHAPE, "residual": "desync", "desync_tp": 2, "desync_pattern": ["mlp", "x", "none", "none"]}
    with pytest.raises(InputError, match=r"^m/config.json: desync_pattern: 'x' is not one of"):
        check_model_fields(fields, "m/config.json")
    args = check_model_fields({**fields, "desync_pattern": None}, "m/config.json")
    check_tp_degree(args, 1)  # the emulation
    check_tp_degree(args, 2)  # its own degree
    with pytest.raises(InputError, match=r"built for tensor-parallel degree 2 .* not at TP 4$"):
        check_tp_degree(args, 4, "m")
