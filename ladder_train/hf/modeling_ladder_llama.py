"""A transformers causal LM for the residual layouts of ladder-train (arXiv 2501.06589), built from
transformers' Llama pieces: its attention (so ``attn_implementation`` eager / sdpa applies), MLP, RMSNorm,
rotary embedding, cache classes (so ``generate()`` decodes with the KV cache) and weight names. Imports only
torch and transformers, so an export folder loads with ``trust_remote_code=True`` where ladder-train is absent.

    standard  r = r + A(norm1(r));  r = r + M(norm2(r))
    parallel  n = norm1(r);         r = r + A(n) + M(n)        (no post_attention_layernorm)
    ladder    each module's output joins the stream one module late (a hybrid keeps its first layers standard):
              r = r + a_prev;  a = A(norm1(r));  r = r + m_prev;  m = M(norm2(r));  the last a, m join before the norm
    desync    built for TP degree t: t residual streams x_s, stream s through TP rank s's slice of each module
              (p_s its partial output); a module that does not reduce gives x_s = x_s + p_s, one that does
              re-synchronises them: x = sum_s(p_s + x_s / t) (the last module always; a hybrid's first layers standard)

The weights are ladder-train's export (same names as a Llama). Tensor parallelism through transformers' own
``tp_plan`` reduces each module's output at once: the same function for standard, parallel and ladder, without the
ladder's overlap (ladder-train's inference module provides that); a desync model's t streams are emulated on one
device here (its function is that of t ranks: served at TP t by ladder-train, not through ``tp_plan``).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.utils import can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.output_capturing import capture_outputs

from .configuration_ladder_llama import LadderLlamaConfig

# The cache's name in transformers' keywords and output fields: ``cache`` where transformers renamed it (5.24, which
# still takes ``past_key_values`` with a FutureWarning), ``past_key_values`` before. Read off the output class, so
# no version number is compared.
CACHE = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_keyword(forward):
    """``forward(..., cache=...)`` also called with ``past_key_values=``, as Llama's forwards are: where transformers
    renamed it, through its own deprecation of the old name; before, silently (it is the name generate() passes)."""
    if CACHE == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)

    def renamed(*args, **kwargs):
        if "past_key_values" in kwargs:
            old = kwargs.pop("past_key_values")
            kwargs["cache"] = old if kwargs.get("cache") is None else kwargs["cache"]
        return forward(*args, **kwargs)

    # functools.wraps without its import (the file imports only torch and transformers): generate() reads the
    # signature of forward through __wrapped__
    renamed.__wrapped__, renamed.__name__, renamed.__doc__ = forward, forward.__name__, forward.__doc__
    return renamed


def _stream_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Streams ``x`` (t, B, T, D), stream s through rank s's rows of ``weight`` (its s-th of t equal row blocks):
    the t shards' outputs side by side (B, T, O), as the ranks' heads or hidden units lie in the whole model."""
    return torch.cat([F.linear(xs, ws) for xs, ws in zip(x, weight.chunk(x.shape[0]), strict=True)], dim=-1)


def _stream_cols(h: torch.Tensor, weight: torch.Tensor, streams: int) -> torch.Tensor:
    """Each rank's slice of ``h`` (B, T, I) through its input columns of ``weight``: the t partial sums (t, B, T, D)
    that TP ranks would all-reduce, kept apart."""
    pairs = zip(h.chunk(streams, dim=-1), weight.chunk(streams, dim=1), strict=True)
    return torch.stack([F.linear(hs, ws) for hs, ws in pairs])


class LadderLlamaDesyncAttention(LlamaAttention):
    """Attention of a desync layer: stream s of (t, B, T, D) through TP rank s's query heads and the KV heads that
    rank holds (its n_kv / t of them, or above n_kv heads one replicated head, s // (t / n_kv), so the cache holds
    max(n_kv, t) heads: ``config.cache_key_value_heads()``); returns the t partial outputs (t, B, T, D), unreduced,
    and the attention weights (B, H, T, S) of all H query heads."""

    def __init__(self, config: LadderLlamaConfig, layer_idx: int):
        super().__init__(config=config, layer_idx=layer_idx)
        self.streams = config.desync_tp
        self.num_key_value_groups = config.num_attention_heads // config.cache_key_value_heads()[layer_idx]

    def _rank_kv(self, weight: torch.Tensor) -> torch.Tensor:
        """k_proj or v_proj arranged so that rank s's row block is the KV heads rank s holds."""
        n_kv = self.config.num_key_value_heads
        if self.streams <= n_kv:
            return weight
        per_head = weight.view(n_kv, -1, weight.shape[1])
        return per_head.repeat_interleave(self.streams // n_kv, dim=0).flatten(0, 1)

    def _check_cache_heads(self, cache) -> None:
        """A cache sized before this layer wrote to it (a static cache initialised from config.num_key_value_heads,
        a paged cache) must hold the streams' heads; refused in one line instead of failing inside an update."""
        layers = getattr(cache, "layers", None)
        if layers is None:
            sized = getattr(cache, "num_key_value_heads", None)
        else:
            layer = layers[self.layer_idx] if self.layer_idx < len(layers) else None
            keys = getattr(layer, "keys", None) if getattr(layer, "is_initialized", False) else None
            sized = keys.shape[1] if isinstance(keys, torch.Tensor) and keys.dim() == 4 else None
        heads = self.config.cache_key_value_heads()[self.layer_idx]
        if sized is not None and sized != heads:
            raise ValueError(
                f"desync_tp={self.streams}: the cache of layer {self.layer_idx} holds {sized} KV heads, this model's "
                f"{heads} (config.cache_key_value_heads(); num_key_value_heads={self.config.num_key_value_heads})"
            )

    @cache_keyword
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        batch, seq = hidden_states.shape[1:3]

        def heads(weight):
            return _stream_rows(hidden_states, weight).view(batch, seq, -1, self.head_dim).transpose(1, 2)

        query = heads(self.q_proj.weight)
        key, value = heads(self._rank_kv(self.k_proj.weight)), heads(self._rank_kv(self.v_proj.weight))
        query, key = apply_rotary_pos_emb(query, key, *position_embeddings)
        if cache is not None:
            self._check_cache_heads(cache)
            key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        return _stream_cols(out.reshape(batch, seq, -1), self.o_proj.weight, self.streams), weights


class LadderLlamaDesyncMLP(LlamaMLP):
    """SwiGLU of a desync layer: stream s of (t, B, T, D) through rank s's hidden units; the t partial outputs."""

    def forward(self, x):
        hidden = self.act_fn(_stream_rows(x, self.gate_proj.weight)) * _stream_rows(x, self.up_proj.weight)
        return _stream_cols(hidden, self.down_proj.weight, x.shape[0])


class LadderLlamaDecoderLayer(nn.Module):
    """One layer of any layout. ``forward(r, pending_attn, pending_mlp, ...)`` returns ``(hidden, r, pending_attn,
    pending_mlp)``: the stream and the ladder's pending (attention, MLP) outputs, None for layouts that add their
    outputs at once, led by the layer's hidden state (B, T, D) that ``output_hidden_states`` records: the stream
    with every output computed so far joined (a ladder's pending ones added), and between desync modules the mean
    of the streams (what the next re-synchronisation starts from). A desync layer's stream is (B, T, D) while the
    ranks are synchronised and (t, B, T, D) between a module that does not reduce and the next that does;
    ``reduces``: whether its (attention, MLP) re-synchronise them."""

    def __init__(self, config: LadderLlamaConfig, layer_idx: int, layout: str, reduces=(True, True)):
        super().__init__()
        self.layout = layout
        self.reduces = reduces
        desync = layout == "desync"
        self.self_attn = (LadderLlamaDesyncAttention if desync else LlamaAttention)(config=config, layer_idx=layer_idx)
        self.mlp = (LadderLlamaDesyncMLP if desync else LlamaMLP)(config)
        self.streams = config.desync_tp
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if layout != "parallel":  # the parallel layout's attention and MLP share one norm
            self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def _attention(self, x, position_embeddings, attention_mask, cache, **kwargs) -> torch.Tensor:
        out, _ = self.self_attn(x, position_embeddings, attention_mask, cache, **kwargs)
        return out

    def forward(self, r, pending_attn, pending_mlp, position_embeddings, attention_mask, cache, **kwargs):
        attend = lambda x: self._attention(x, position_embeddings, attention_mask, cache, **kwargs)  # noqa: E731
        if self.layout == "standard":
            r = r + attend(self.input_layernorm(r))
            r = r + self.mlp(self.post_attention_layernorm(r))
            return r, r, None, None
        if self.layout == "parallel":
            n = self.input_layernorm(r)
            r = r + (attend(n) + self.mlp(n))
            return r, r, None, None
        if self.layout == "desync":
            r = self._desync_module(r, attend, self.input_layernorm, self.reduces[0])
            r = self._desync_module(r, self.mlp, self.post_attention_layernorm, self.reduces[1])
            return (r if r.dim() == 3 else r.mean(0)), r, None, None
        if pending_attn is not None:
            r = r + pending_attn
        attn_out = attend(self.input_layernorm(r))
        if pending_mlp is not None:
            r = r + pending_mlp
        mlp_out = self.mlp(self.post_attention_layernorm(r))
        return r + attn_out + mlp_out, r, attn_out, mlp_out

    def _desync_module(self, r, module, norm, reduce: bool) -> torch.Tensor:
        """Each stream adds its rank's partial output, or where the module reduces, the all-reduce of the t ranks:
        sum_s(partial_s + x_s / t), one stream again."""
        x = norm(r)
        if x.dim() == 3:  # synchronised: every rank reads the same stream
            x = x.expand(self.streams, *x.shape)
        partial = module(x)
        return (partial + r / self.streams).sum(0) if reduce else r + partial


class LadderLlamaPreTrainedModel(LlamaPreTrainedModel):
    config_class = LadderLlamaConfig
    config: LadderLlamaConfig
    _no_split_modules = ["LadderLlamaDecoderLayer"]
    # what output_hidden_states / output_attentions record, as Llama's: each layer's first output, and the weights
    # of every attention (the desync attention is a LlamaAttention)
    _can_record_outputs = {"hidden_states": LadderLlamaDecoderLayer, "attentions": LlamaAttention}
    supports_gradient_checkpointing = False


class LadderLlamaModel(LadderLlamaPreTrainedModel):
    def __init__(self, config: LadderLlamaConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LadderLlamaDecoderLayer(config, i, layout, reduces)
            for i, (layout, reduces) in enumerate(zip(config.layer_layouts(), config.layer_reduces(), strict=True))
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.post_init()

    @cache_keyword
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            seen = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + seen).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{CACHE: cache},
        )
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)
        hidden, r, pending_attn, pending_mlp = inputs_embeds, inputs_embeds, None, None
        for layer in self.layers:
            hidden, r, pending_attn, pending_mlp = layer(
                r, pending_attn, pending_mlp, position_embeddings, mask, cache, position_ids=position_ids, **kwargs
            )
        # the ladder's last two outputs join before the final norm: the last layer's hidden state, in every layout
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden), **{CACHE: cache})


class LadderLlamaForCausalLM(LadderLlamaPreTrainedModel, GenerationMixin):
    """A desync model has no tensor-parallel plan (``tp_plan`` is empty: every weight replicated), its blocks as the
    head: the blocks already compute the t ranks' slices on each device, and a sharded head would split the one
    Parameter it shares with the embedding (tied, the default) from an embedding the plan leaves whole."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: LadderLlamaConfig):
        super().__init__(config)
        self.model = LadderLlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        if config.residual == "desync":
            self._tp_plan = {}

    @cache_keyword
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{CACHE: getattr(outputs, CACHE)},
        )


__all__ = ["LadderLlamaForCausalLM", "LadderLlamaModel", "LadderLlamaPreTrainedModel"]
