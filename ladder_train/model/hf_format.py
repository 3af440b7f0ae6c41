"""The export format: Hugging Face Llama parameter names in ``model.safetensors`` plus ``config.json``.

A standard-layout export loads in ``transformers.LlamaForCausalLM``; parallel and ladder exports add
``residual`` and ``ladder_layers`` fields that only ladder-train reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .transformer import ModelArgs, Transformer

WEIGHTS_FILE = "model.safetensors"

# project name pattern -> HF name pattern ({i} is the layer index)
_LAYER_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def to_hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _LAYER_RE.match(name)
    if not match or match.group(2) not in _LAYER_NAMES:
        raise KeyError(f"no Hugging Face name for parameter {name!r}")
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"


def export_tensor_names(hf_names) -> dict[str, str]:
    """Our parameter name -> the file's name, for every tensor of an export. ``lm_head.weight`` is skipped:
    the output head is tied to the embedding (``tie_word_embeddings``)."""
    return {from_hf_name(k): k for k in hf_names if k != "lm_head.weight"}


def from_hf_name(name: str) -> str:
    for ours, theirs in _TOP_NAMES.items():
        if name == theirs:
            return ours
    match = _HF_LAYER_RE.match(name)
    inverse = {v: k for k, v in _LAYER_NAMES.items()}
    if not match or match.group(2) not in inverse:
        raise KeyError(f"unexpected parameter {name!r} in the export")
    return f"layers.{match.group(1)}.{inverse[match.group(2)]}"


def hf_config(args: ModelArgs, dtype: torch.dtype = torch.float32) -> dict:
    """config.json: the LlamaConfig fields, plus ladder-train's own layout fields."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "max_position_embeddings": args.max_seq_len,
        "rope_theta": args.rope_theta,
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": args.init_std,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "residual": args.residual,
        "ladder_layers": args.ladder_layers,
    }


def args_from_hf_config(config: dict) -> ModelArgs:
    return ModelArgs(
        vocab_size=config["vocab_size"],
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=config["num_attention_heads"],
        n_kv_heads=config.get("num_key_value_heads"),
        ffn_dim=config["intermediate_size"],
        max_seq_len=config.get("max_position_embeddings", 2048),
        rope_theta=config.get("rope_theta", 10000.0),
        norm_eps=config.get("rms_norm_eps", 1e-5),
        init_std=config.get("initializer_range", 0.02),
        residual=config.get("residual", "standard"),
        ladder_layers=config.get("ladder_layers"),
    )


def save_export(model: Transformer, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``model.safetensors`` (HF names) and ``config.json`` for a full (unsharded) model."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {to_hf_name(k): v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, out / WEIGHTS_FILE, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(model.args, dtype), indent=2) + "\n")
    return out
