"""The small exports the vLLM tests serve (head_dim 32: vLLM's CPU attention backend needs at least 32) and what
ladder-train's own engine makes of them: greedy tokens and each token's log-probability."""

from __future__ import annotations

from pathlib import Path

import torch

from ladder_train.data.tokenizer import byte_tokenizer
from ladder_train.inference import Generator
from ladder_train.loading import load_model
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export
from ladder_train.model.transformer import RMSNorm

SERVE_SHAPE = dict(vocab_size=257, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=128)
# layout name -> ModelArgs fields; each is an export of its own
SERVE_LAYOUTS = {
    "standard": dict(residual="standard"),
    "parallel": dict(residual="parallel"),
    "ladder": dict(residual="ladder"),
    "hybrid": dict(residual="ladder", ladder_layers=2),
    "desync": dict(residual="desync", desync_tp=2),
}
# prompts of different lengths (continuous batching and the paged cache see unequal sequences)
PROMPTS = [[5 + (7 * i + 3 * j) % 240 for j in range(n)] for i, n in enumerate((3, 11, 6, 17, 1))]
NEW_TOKENS = 12


def make_export(root: Path, layout: str) -> Path:
    """A model of ``layout`` with weights wide enough that greedy tokens vary and no two logits tie, saved as an
    export with the byte tokenizer."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**SERVE_SHAPE, **SERVE_LAYOUTS[layout]))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
        for param in model.parameters():
            if param.dim() > 1:
                param.mul_(12)
    out = save_export(model, root / layout)
    byte_tokenizer().save(str(out / "tokenizer.json"))
    return out


@torch.no_grad()
def engine_reference(path: Path, prompts=PROMPTS, new_tokens: int = NEW_TOKENS) -> list[dict]:
    """Per prompt, ladder-train's greedy tokens (its Generator, one prompt at a time, TP 1: a desync model's streams
    emulated) and the log-probability of each of them (the full forward over prompt + tokens)."""
    model = load_model(str(path))
    model.eval()
    out = []
    for prompt in prompts:
        tokens = Generator(model).generate(torch.tensor([prompt]), new_tokens)[0].tolist()
        model.clear_kv_cache()
        logits = model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        out.append({"tokens": tokens, "logprobs": logprobs.tolist()})
    return out
