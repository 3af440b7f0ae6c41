"""``LadderLlamaForCausalLM`` in vLLM: every residual layout of ladder-train's exports on vLLM's own layers (its QKV,
column and row parallel linears, attention backend and paged KV cache, rotary embedding, RMSNorm, vocabulary-parallel
embedding and head), vLLM's Llama attention and MLP unchanged except that their row-parallel outputs are left as
partial sums: each layer adds them to the residual stream as its layout says (docs/design.md's equations).

    standard  r = r + AR(A(norm1(r)));  r = r + AR(M(norm2(r)))
    parallel  n = norm1(r);  r = r + AR(A(n) + M(n))
    ladder    r = r + wait(a);  a = issue(A(norm1(r)));  r = r + wait(m);  m = issue(M(norm2(r)))
    desync    rank s keeps its own stream r_s: r_s = r_s + p_s where a module does not reduce,
              r = AR(p_s + r_s / t) where it does (served at TP t only)

A hybrid's first layers are standard. The ladder's ``issue`` / ``wait`` are ``serve.comm``'s: with ``ladder_overlap``
true in the config (``--hf-overrides '{"ladder_overlap": true}'``) each module's all-reduce is held across the next
module; otherwise vLLM's all-reduce, waited at once.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.llama import LlamaAttention, LlamaMLP, LlamaModel
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix

from .comm import communicators
from .layouts import layer_plan, overlap_enabled


class LadderDecoderLayer(nn.Module):
    """One layer of any layout; ``forward`` returns the stream and the ladder's pending (attention, MLP) all-reduces,
    None for the layouts that add their outputs at once."""

    def __init__(self, vllm_config: VllmConfig, prefix: str, layout: str, reduces: tuple[bool, bool], comm):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.layout, self.reduces, self.comm = layout, reduces, comm
        self.streams = getattr(config, "desync_tp", None) or 1
        self.self_attn = LlamaAttention(
            config=config,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            max_position_embeddings=getattr(config, "max_position_embeddings", 8192),
            quant_config=vllm_config.quant_config,
            cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.self_attn",
        )
        self.self_attn.o_proj.reduce_results = False  # the layer reduces, where its layout says
        self.mlp = LlamaMLP(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            hidden_act=config.hidden_act,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.mlp",
            reduce_results=False,
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if layout != "parallel":  # the parallel layout's attention and MLP share one norm
            self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, r, pending_attn, pending_mlp):
        comm = self.comm

        def attend(x):
            return self.self_attn(positions=positions, hidden_states=x)

        if self.layout == "standard":
            r = r + comm.wait(comm.reduce(attend(self.input_layernorm(r))))
            return r + comm.wait(comm.reduce(self.mlp(self.post_attention_layernorm(r)))), None, None
        if self.layout == "parallel":
            n = self.input_layernorm(r)
            return r + comm.wait(comm.reduce(attend(n) + self.mlp(n))), None, None
        if self.layout == "desync":
            r = self._desync_module(r, attend, self.input_layernorm, self.reduces[0])
            return self._desync_module(r, self.mlp, self.post_attention_layernorm, self.reduces[1]), None, None
        # ladder: each all-reduce issued as its partial exists, waited where the stream takes it, a module later;
        # the fences keep the stream behind the module just computed under inductor (comm.fence)
        if pending_attn is not None:
            r = r + comm.wait(pending_attn)
        r, attn_partial = comm.fence(r, attend(self.input_layernorm(r)))
        attn_out = comm.reduce(attn_partial)
        if pending_mlp is not None:
            r = r + comm.wait(pending_mlp)
        r, mlp_partial = comm.fence(r, self.mlp(self.post_attention_layernorm(r)))
        return r, attn_out, comm.reduce(mlp_partial)

    def _desync_module(self, r, module, norm, reduce: bool):
        """This rank's stream plus its partial output, or where the module reduces the sum over the t ranks of
        partial + stream / t: one stream again."""
        partial = module(norm(r))
        return self.comm.wait(self.comm.reduce(partial + r / self.streams)) if reduce else r + partial


@support_torch_compile(
    dynamic_arg_dims={"input_ids": {0: "b"}, "positions": {0: "b"}, "inputs_embeds": {0: "b"}},
)
class LadderModel(nn.Module):
    """The embedding, the layers of ``layer_plan`` and the final norm; Llama's weight names."""

    hf_to_vllm_mapper = LlamaModel.hf_to_vllm_mapper

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        comms = communicators(overlap_enabled(config))
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LadderDecoderLayer(vllm_config, f"{prefix}.layers.{i}", layout, reduces, comms[layout])
            for i, (layout, reduces) in enumerate(layer_plan(config))
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None) -> torch.Tensor:
        r = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        pending_attn = pending_mlp = None
        for layer in self.layers:
            r, pending_attn, pending_mlp = layer(positions, r, pending_attn, pending_mlp)
        if pending_attn is not None:  # the ladder's last two outputs join before the final norm
            comm = self.layers[-1].comm
            r = r + comm.wait(pending_attn) + comm.wait(pending_mlp)
        return self.norm(r)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class LadderLlamaForCausalLM(nn.Module):
    """The architecture ladder-train's parallel, ladder and desync exports name (a standard export is a plain
    Llama, which vLLM serves itself; this class serves it too, through ``--hf-overrides``)."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = LadderModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)
