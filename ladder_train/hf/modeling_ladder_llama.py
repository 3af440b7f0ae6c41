"""A transformers causal LM for the three residual layouts of ladder-train (arXiv 2501.06589), built from
transformers' Llama pieces: its attention (so ``attn_implementation`` eager / sdpa applies), MLP, RMSNorm,
rotary embedding, cache classes (so ``generate()`` decodes with the KV cache) and weight names. Imports only
torch and transformers, so an export folder loads with ``trust_remote_code=True`` where ladder-train is absent.

    standard  r = r + A(norm1(r));  r = r + M(norm2(r))
    parallel  n = norm1(r);         r = r + A(n) + M(n)        (no post_attention_layernorm)
    ladder    each module's output joins the stream one module late (a hybrid keeps its first layers standard):
              r = r + a_prev;  a = A(norm1(r));  r = r + m_prev;  m = M(norm2(r));  the last a, m join before the norm

The weights are ladder-train's export (same names as a Llama). Tensor parallelism through transformers' own
``tp_plan`` reduces each module's output at once: the same function, without the ladder's overlap (ladder-train's
inference module provides that).
"""

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from .configuration_ladder_llama import LadderLlamaConfig


class LadderLlamaDecoderLayer(nn.Module):
    """One layer of any layout. ``forward`` returns the stream and the ladder's pending (attention, MLP) outputs,
    which are None for layouts that add their outputs at once."""

    def __init__(self, config: LadderLlamaConfig, layer_idx: int, layout: str):
        super().__init__()
        self.layout = layout
        self.self_attn = LlamaAttention(config=config, layer_idx=layer_idx)
        self.mlp = LlamaMLP(config)
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
            return r, None, None
        if self.layout == "parallel":
            n = self.input_layernorm(r)
            return r + (attend(n) + self.mlp(n)), None, None
        if pending_attn is not None:
            r = r + pending_attn
        attn_out = attend(self.input_layernorm(r))
        if pending_mlp is not None:
            r = r + pending_mlp
        return r, attn_out, self.mlp(self.post_attention_layernorm(r))


class LadderLlamaPreTrainedModel(LlamaPreTrainedModel):
    config_class = LadderLlamaConfig
    config: LadderLlamaConfig
    _no_split_modules = ["LadderLlamaDecoderLayer"]
    _can_record_outputs = {}
    supports_gradient_checkpointing = False


class LadderLlamaModel(LadderLlamaPreTrainedModel):
    def __init__(self, config: LadderLlamaConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        layouts = config.layer_layouts()
        self.layers = nn.ModuleList(LadderLlamaDecoderLayer(config, i, layout) for i, layout in enumerate(layouts))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.post_init()

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
            cache=cache,
            position_ids=position_ids,
        )
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)
        r, pending_attn, pending_mlp = inputs_embeds, None, None
        for layer in self.layers:
            r, pending_attn, pending_mlp = layer(
                r, pending_attn, pending_mlp, position_embeddings, mask, cache, position_ids=position_ids, **kwargs
            )
        if pending_attn is not None:  # the ladder's last two outputs join before the final norm
            r = r + pending_attn + pending_mlp
        return BaseModelOutputWithPast(last_hidden_state=self.norm(r), cache=cache if use_cache else None)


class LadderLlamaForCausalLM(LadderLlamaPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: LadderLlamaConfig):
        super().__init__(config)
        self.model = LadderLlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

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
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache)


__all__ = ["LadderLlamaForCausalLM", "LadderLlamaModel", "LadderLlamaPreTrainedModel"]
