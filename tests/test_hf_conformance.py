"""Our transformers classes (ladder_train/hf) keep the contracts transformers' own model tests hold a causal LM to
(ModelTesterMixin, GenerationTesterMixin: their files are not in the wheel, so these are written out here), for
every layout shape: per-layer hidden states and attentions, tuple outputs, the old cache keyword, cache shapes
against the config, eager = sdpa on hidden states, assisted decoding with outputs, batched = single generation;
and the tensor-parallel plan a distributed load reads. Tiny fp32 models; a failing contract names its layout."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import StaticCache

from ladder_train.hf.configuration_ladder_llama import LadderLlamaConfig
from ladder_train.hf.modeling_ladder_llama import CACHE, LadderLlamaForCausalLM

SHAPE = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.3,  # logits far from uniform, so greedy tokens vary and near-ties are rare
)
LAYOUTS = {
    "parallel": dict(residual="parallel", tie_word_embeddings=False),
    "ladder": dict(residual="ladder", tie_word_embeddings=True),
    "hybrid ladder": dict(residual="ladder", ladder_layers=2, tie_word_embeddings=True),
    "desync t=2": dict(residual="desync", desync_tp=2, tie_word_embeddings=True),
    "desync t=4 every 4": dict(residual="desync", desync_tp=4, desync_reduce_every=4, tie_word_embeddings=True),
    "desync pattern": dict(
        residual="desync", desync_tp=2, desync_pattern=["none", "attention", "both", "mlp"], tie_word_embeddings=True
    ),
    "hybrid desync t=4": dict(residual="desync", desync_tp=4, desync_layers=2, tie_word_embeddings=True),
}
layouts = pytest.mark.parametrize("layout", LAYOUTS)
PROMPT = torch.randint(0, SHAPE["vocab_size"], (3, 9), generator=torch.Generator().manual_seed(5))
# fp32 sums in another order (sdpa's kernel, a cache's shorter matmuls) differ by up to ~2e-5 on these activations
# (init 0.3); a wrong cache or mask differs by 1e-1
CLOSE = dict(rtol=1e-4, atol=1e-4)
HEAD_DIM = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
_MODELS: dict = {}


def model(layout: str, attn: str = "eager") -> LadderLlamaForCausalLM:
    """The layout's tiny model (norm weights away from ones); the sdpa one has the eager one's weights."""
    if (layout, attn) not in _MODELS:
        torch.manual_seed(0)
        built = LadderLlamaForCausalLM(LadderLlamaConfig(**SHAPE, **LAYOUTS[layout], attn_implementation=attn))
        if attn == "eager":
            with torch.no_grad():
                for name, p in built.named_parameters():
                    if "norm" in name:
                        p.add_(0.3 * torch.randn_like(p))
        else:
            built.load_state_dict(model(layout).state_dict())
        _MODELS[layout, attn] = built.eval()
    return _MODELS[layout, attn]


def first_layers(layout: str, n: int) -> torch.Tensor:
    """The last hidden state of the layout's model cut to its first ``n`` layers (a hybrid's ladder layers are its
    last ones)."""
    fields, layers = dict(LAYOUTS[layout]), SHAPE["num_hidden_layers"]
    if "ladder_layers" in fields:
        fields["ladder_layers"] = max(0, n - (layers - fields["ladder_layers"]))
    cut = LadderLlamaForCausalLM(LadderLlamaConfig(**{**SHAPE, "num_hidden_layers": n}, **fields)).eval()
    cut.load_state_dict(model(layout).state_dict(), strict=False)  # without the later layers' weights
    return cut.model(PROMPT).last_hidden_state


def named(layout: str):
    """assert_close's message, led by the layout."""
    return lambda text: f"{layout}: {text}"


def expected_cache_heads(layout: str) -> list[int]:
    """Per layer: a desync layer above its KV heads keeps one per stream; every other layer the config's KV heads
    (a hybrid's first layers are standard)."""
    fields, n_kv, layers = LAYOUTS[layout], SHAPE["num_key_value_heads"], SHAPE["num_hidden_layers"]
    if fields["residual"] != "desync":
        return [n_kv] * layers
    desync = fields.get("desync_layers", layers)
    return [n_kv] * (layers - desync) + [max(n_kv, fields["desync_tp"])] * desync


def presized_static_cache(m, heads: list[int]) -> StaticCache:
    """A static cache whose layers are sized before the first forward, layer i for heads[i] KV heads (each layer's
    own initialisation: early_initialization takes a list from transformers 5.5.4 only)."""
    cache = StaticCache(config=m.config, max_cache_len=32)
    for layer, n in zip(cache.layers, heads, strict=True):
        empty = torch.zeros(PROMPT.shape[0], n, 0, HEAD_DIM)
        layer.lazy_initialization(empty, empty)
    return cache


def greedy(m, prompt: torch.Tensor, n: int = 6, **kwargs):
    return m.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False, eos_token_id=None, **kwargs
    )


@layouts
@torch.no_grad()
def test_hidden_states_and_attentions_per_layer(layout):
    m = model(layout)
    out = m(PROMPT, output_hidden_states=True, output_attentions=True)
    layers, (batch, seq) = SHAPE["num_hidden_layers"], PROMPT.shape
    assert len(out.hidden_states) == layers + 1, layout
    assert all(h.shape == (batch, seq, SHAPE["hidden_size"]) for h in out.hidden_states), layout
    assert torch.equal(out.hidden_states[0], m.model.embed_tokens(PROMPT)), layout
    # the last is the final norm's output, from which the head computes the logits
    torch.testing.assert_close(m.lm_head(out.hidden_states[-1]), out.logits, msg=named(layout))
    assert len(out.attentions) == layers, layout
    for weights in out.attentions:
        assert weights.shape == (batch, SHAPE["num_attention_heads"], seq, seq), layout
        torch.testing.assert_close(
            weights.sum(-1), torch.ones(batch, SHAPE["num_attention_heads"], seq), msg=named(layout)
        )
        assert weights.triu(1).abs().max() == 0, layout  # causal
    if LAYOUTS[layout]["residual"] != "desync":  # each is the stream the first i layers hand their final norm
        for i in range(1, layers):
            torch.testing.assert_close(m.model.norm(out.hidden_states[i]), first_layers(layout, i), msg=named(layout))
    plain = m(PROMPT)
    assert plain.hidden_states is None and plain.attentions is None, layout
    torch.testing.assert_close(plain.logits, out.logits, rtol=0, atol=0, msg=named(layout))


@layouts
@torch.no_grad()
def test_tuple_outputs_with_return_dict_false(layout):
    m = model(layout)
    out = m(PROMPT, labels=PROMPT, use_cache=True, output_hidden_states=True)
    as_tuple = m(PROMPT, labels=PROMPT, use_cache=True, output_hidden_states=True, return_dict=False)
    assert isinstance(as_tuple, tuple), layout
    assert len(as_tuple) == 4, layout  # loss, logits, cache, hidden states
    assert torch.equal(as_tuple[0], out.loss) and torch.equal(as_tuple[1], out.logits), layout
    assert as_tuple[2].get_seq_length() == PROMPT.shape[1], layout
    assert all(torch.equal(a, b) for a, b in zip(as_tuple[3], out.hidden_states, strict=True)), layout
    base = m.model(PROMPT, return_dict=False)
    assert isinstance(base, tuple) and torch.equal(base[0], m.model(PROMPT).last_hidden_state), layout


@layouts
@pytest.mark.parametrize("keyword", ["past_key_values", "cache"])
@torch.no_grad()
def test_continuing_a_sequence_through_either_cache_keyword_equals_the_full_forward(layout, keyword):
    m = model(layout)
    full = m(PROMPT).logits
    first = m(PROMPT[:, :5], use_cache=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rest = m(PROMPT[:, 5:], use_cache=True, **{keyword: getattr(first, CACHE)})
    # past_key_values= is the deprecated name where transformers renamed it: one FutureWarning, as Llama gives
    deprecated = [
        w for w in caught if w.category is FutureWarning and "`past_key_values` is deprecated" in str(w.message)
    ]
    assert len(deprecated) == (keyword == "past_key_values" and CACHE == "cache"), layout
    torch.testing.assert_close(rest.logits, full[:, 5:], **CLOSE, msg=named(layout))
    assert getattr(rest, CACHE).get_seq_length() == PROMPT.shape[1], layout


@layouts
@torch.no_grad()
def test_cache_shapes_against_the_config(layout):
    m = model(layout)
    cache = getattr(m(PROMPT, use_cache=True), CACHE)
    heads = expected_cache_heads(layout)
    assert len(cache.layers) == SHAPE["num_hidden_layers"], layout
    for layer, n in zip(cache.layers, heads, strict=True):
        assert layer.keys.shape == layer.values.shape == (PROMPT.shape[0], n, PROMPT.shape[1], HEAD_DIM), layout
    assert m.config.cache_key_value_heads() == heads, layout  # what a consumer sizing a cache reads
    # a static cache sized before the first forward by what the config says a layer holds works
    sized = presized_static_cache(m, m.config.cache_key_value_heads())
    assert torch.equal(greedy(m, PROMPT, **{CACHE: sized}), greedy(m, PROMPT)), layout


@pytest.mark.parametrize("layout", [name for name, fields in LAYOUTS.items() if fields["residual"] == "desync"])
@torch.no_grad()
def test_a_desync_layer_refuses_in_one_line_a_cache_sized_for_other_heads(layout):
    """Above its KV heads, a cache sized by num_key_value_heads, as a consumer reading only the config would size
    it; at t = 2, one with 2 heads more in the desync layers."""
    m, heads, n_kv = model(layout), expected_cache_heads(layout), SHAPE["num_key_value_heads"]
    first = SHAPE["num_hidden_layers"] - LAYOUTS[layout].get("desync_layers", SHAPE["num_hidden_layers"])
    other = [n_kv if n > n_kv else n + 2 * (i >= first) for i, n in enumerate(heads)]
    wrong = presized_static_cache(m, other)
    message = rf"^desync_tp=\d: the cache of layer {first} holds {other[first]} KV heads, this model's {heads[first]} "
    with pytest.raises(ValueError, match=message):
        m(PROMPT, use_cache=True, **{CACHE: wrong})


@layouts
@torch.no_grad()
def test_eager_and_sdpa_agree_on_every_hidden_state(layout):
    eager = model(layout).model(PROMPT, output_hidden_states=True).hidden_states
    sdpa = model(layout, "sdpa").model(PROMPT, output_hidden_states=True).hidden_states
    assert model(layout, "sdpa").config._attn_implementation == "sdpa"
    assert len(eager) == len(sdpa) == SHAPE["num_hidden_layers"] + 1, layout
    for a, b in zip(eager, sdpa, strict=True):
        torch.testing.assert_close(a, b, **CLOSE, msg=named(layout))


@layouts
@torch.no_grad()
def test_assisted_decoding_with_hidden_states_and_attentions_matches_greedy(layout):
    m, prompt = model(layout), PROMPT[:1]
    flags = dict(return_dict_in_generate=True, output_hidden_states=True, output_attentions=True, output_scores=True)
    plain = greedy(m, prompt, **flags)
    assisted = greedy(m, prompt, assistant_model=m, **flags)
    assert torch.equal(assisted.sequences, plain.sequences), layout
    assert len(set(plain.sequences[0, prompt.shape[1] :].tolist())) > 1, layout  # not one repeated token
    for out in (plain, assisted):
        assert len(out.hidden_states) == len(out.attentions) >= 1, layout
        assert all(len(step) == SHAPE["num_hidden_layers"] + 1 for step in out.hidden_states), layout
        assert all(len(step) == SHAPE["num_hidden_layers"] for step in out.attentions), layout
    new = sum(step[-1].shape[1] for step in assisted.hidden_states)  # every position the model saw, once
    assert new == assisted.sequences.shape[1] - 1, layout


@layouts
@torch.no_grad()
def test_batched_generation_equals_each_prompt_alone(layout):
    m = model(layout)
    batched = greedy(m, PROMPT, n=8)
    for row in range(PROMPT.shape[0]):
        assert torch.equal(greedy(m, PROMPT[row : row + 1], n=8)[0], batched[row]), (layout, row)
    hidden = m.model(PROMPT, output_hidden_states=True).hidden_states
    alone = m.model(PROMPT[1:2], output_hidden_states=True).hidden_states
    for a, b in zip(hidden, alone, strict=True):
        torch.testing.assert_close(a[1:2], b, **CLOSE, msg=named(layout))


@layouts
def test_the_tensor_parallel_plan_is_llamas_or_for_desync_empty(layout):
    """A distributed load shards what the plan names. Desync: nothing (its blocks already compute the t ranks'
    slices; a sharded head would split the Parameter it shares with an embedding left whole). The others:
    Llama's plan of the same shape in the installed transformers."""
    ours = model(layout)
    if LAYOUTS[layout]["residual"] == "desync":
        assert ours.tp_plan == {} and ours.config.base_model_tp_plan == {}, layout
        assert ours.lm_head.weight is ours.model.embed_tokens.weight, layout  # tied: the plan must treat both alike
    else:
        fields = {k: v for k, v in LAYOUTS[layout].items() if k == "tie_word_embeddings"}
        llama = LlamaForCausalLM(LlamaConfig(**SHAPE, **fields))
        assert ours.tp_plan == llama.tp_plan, layout
