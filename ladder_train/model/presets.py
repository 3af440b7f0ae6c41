"""Model sizes by name: the paper's (docs/design.md, "Presets") and tiny ones for tests.

Also the counting helpers: parameters (total, non-embedding) and training FLOPs per token for MFU.
"""

from __future__ import annotations

from .transformer import ModelArgs

_STARCODER_VOCAB = 49152

# name -> shape; residual layout and ladder_layers come from the recipe
PRESETS: dict[str, dict] = {
    "1.2B": dict(n_layers=40, dim=1536, n_heads=24, ffn_dim=4096, vocab_size=_STARCODER_VOCAB),
    "3.5B": dict(n_layers=40, dim=2304, n_heads=36, ffn_dim=9216, vocab_size=_STARCODER_VOCAB),
    # the paper's deeper ladders: 52 layers at the 1.2B / 3.5B widths (larger, and still faster at inference
    # than the 40-layer standard models in the paper: not throughput-matched)
    "1.5B": dict(n_layers=52, dim=1536, n_heads=24, ffn_dim=4096, vocab_size=_STARCODER_VOCAB),
    "4.5B": dict(n_layers=52, dim=2304, n_heads=36, ffn_dim=9216, vocab_size=_STARCODER_VOCAB),
    # the 3.5B shape with 32 heads of dim 72, as the reference TP=8 inference benchmark used
    "3.5B-32h": dict(n_layers=40, dim=2304, n_heads=32, ffn_dim=9216, vocab_size=_STARCODER_VOCAB),
    # SmolLM2-135M(-Instruct), a pretrained Llama to adapt into a hybrid ladder (checkpoint.init_from); its
    # config.json writes rms_norm_eps as float32's 1e-5
    "smollm2-135m": dict(
        n_layers=30,
        dim=576,
        n_heads=9,
        n_kv_heads=3,
        ffn_dim=1536,
        vocab_size=_STARCODER_VOCAB,
        max_seq_len=8192,
        rope_theta=100000.0,
        norm_eps=1e-5,
        tie_embeddings=True,
    ),
    # small shapes for CPU tests and smoke runs (StarCoder vocabulary unless a test overrides it)
    "tiny": dict(n_layers=2, dim=64, n_heads=4, ffn_dim=176, vocab_size=_STARCODER_VOCAB, max_seq_len=256),
    "small": dict(n_layers=4, dim=128, n_heads=4, ffn_dim=352, vocab_size=_STARCODER_VOCAB, max_seq_len=512),
}


def preset_args(name: str, **overrides) -> ModelArgs:
    """The ModelArgs of a named preset, with any field overridden (e.g. ``residual="ladder"``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; available: {', '.join(PRESETS)}")
    return ModelArgs(**{**PRESETS[name], **overrides})


def count_params(args: ModelArgs) -> dict[str, int]:
    """Parameter counts from the shape alone (no allocation). A tied head is the embedding, counted once; an
    untied head counts as a second embedding-sized matrix."""
    head_dim = args.head_dim
    attention = args.dim * head_dim * (2 * args.n_heads + 2 * args.n_kv_heads)
    mlp = 3 * args.dim * args.ffn_dim
    norms = sum(1 if layout == "parallel" else 2 for layout in args.layer_layouts()) * args.dim + args.dim
    non_embedding = args.n_layers * (attention + mlp) + norms
    embedding = args.vocab_size * args.dim * (1 if args.tie_embeddings else 2)
    return {"total": non_embedding + embedding, "non_embedding": non_embedding, "embedding": embedding}


def flops_per_token(args: ModelArgs, seq_len: int | None = None, frozen_layers: int = 0) -> float:
    """Training FLOPs (forward + backward) per token: 6 x the parameters each token multiplies through
    (blocks and the LM head; an embedding lookup costs nothing) plus the attention scores and values,
    12 x layers x dim x seq_len (the PaLM appendix B convention, no causal discount).

    ``frozen_layers`` (``train.freeze_layers``: the first K blocks fixed) count 4 x their matmul parameters,
    not 6: no weight gradient is computed for them, but their input gradient still is (the embeddings below
    them train, so the gradient flows through every frozen block). Their attention scores and values keep the
    full 12 x dim x seq_len (none of those matmuls has a weight)."""
    seq_len = seq_len or args.max_seq_len
    n = count_params(args)
    matmul_params = n["non_embedding"] + args.vocab_size * args.dim
    block_matmul = args.dim * args.head_dim * (2 * args.n_heads + 2 * args.n_kv_heads) + 3 * args.dim * args.ffn_dim
    frozen = min(max(frozen_layers, 0), args.n_layers)
    return 6 * matmul_params - 2 * frozen * block_matmul + 12 * args.n_layers * args.dim * seq_len
