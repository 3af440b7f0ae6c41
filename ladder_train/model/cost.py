"""A model's size and training cost from its shape alone: parameter counts and FLOPs per token (MFU)."""

from __future__ import annotations

from .transformer import ModelArgs


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
