"""The one Transformer definition of ladder-train, used by training and by inference.

Pre-norm decoder: RMSNorm, rotary embeddings (rotate-half convention), grouped-query attention through
``F.scaled_dot_product_attention``, SwiGLU MLP, no biases, tied input/output embeddings. Three residual
layouts (docs/design.md has the equations):

    standard  r = r + A(r);  r = r + M(r)
    parallel  n = norm(r);   r = r + A(n) + M(n)
    ladder    each module's output joins the stream one module late, so its all-reduce can overlap
              the next module's compute under tensor parallelism.

Every module output is a *partial sum* under tensor parallelism. The single place where it becomes a
full sum is ``self.comm`` (a :class:`Communicator`): ``comm.reduce(x)`` starts the reduction and
``comm.wait(x)`` returns the reduced tensor. Without tensor parallelism both are the identity, so
training runs exactly the same block code that inference runs under TP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

RESIDUAL_LAYOUTS = ("standard", "parallel", "ladder")


@dataclass
class ModelArgs:
    """The shape of a model. Field names follow nanoGPT/torchtitan; see presets.py for the paper's sizes."""

    vocab_size: int = 49152  # must equal the tokenizer's vocabulary (StarCoder: 49,152)
    dim: int = 1536  # hidden size
    n_layers: int = 40
    n_heads: int = 24
    n_kv_heads: int | None = None  # grouped-query attention; None = n_heads (multi-head attention)
    ffn_dim: int = 4096  # SwiGLU hidden size
    max_seq_len: int = 2048  # rope table length, the longest sequence the model accepts
    rope_theta: float = field(default=10000.0, metadata={"check": (lambda v: v > 0, "positive")})
    norm_eps: float = field(default=1e-5, metadata={"check": (lambda v: v > 0, "positive")})
    # N(0, init_std); block output projections use init_std / sqrt(2 * n_layers)
    init_std: float = field(default=0.02, metadata={"check": (lambda v: v > 0, "positive")})
    residual: str = field(default="standard", metadata={"choices": RESIDUAL_LAYOUTS})  # standard | parallel | ladder
    ladder_layers: int | None = None  # ladder only: the last N layers are ladder, the rest standard; None = all
    tie_embeddings: bool = True  # the output head is the embedding matrix; False: its own `output` weight
    # Llama-3.1's rope frequency scaling, as in a Hugging Face config: {"rope_type": "llama3", "factor",
    # "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}; None = plain RoPE
    rope_scaling: dict | None = None

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def layer_layouts(self) -> list[str]:
        """The residual layout of each layer: a hybrid ladder keeps its first L - N layers standard."""
        if self.residual != "ladder":
            return [self.residual] * self.n_layers
        n_ladder = self.n_layers if self.ladder_layers is None else self.ladder_layers
        return ["standard"] * (self.n_layers - n_ladder) + ["ladder"] * n_ladder


class Communicator:
    """Turns a module's partial output into the full sum. This base class is the no-TP case: identity.

    ``reduce(x)`` starts the reduction of ``x`` and returns a tensor to hand to ``wait`` later;
    ``wait(x)`` returns the reduced tensor. Layouts that add an output at once call ``wait(reduce(x))``;
    the ladder calls ``reduce`` when the module finishes and ``wait`` one module later.
    """

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def wait(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def fence(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tensors unchanged: a point they pass together. A compiler hint only (see the TP communicator):
        nothing that reads them afterwards may be moved before all of them have been computed."""
        return tensors


NO_COMM = Communicator()


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back, as Hugging Face Llama does (so exports give the same logits)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama-3.1's scaled frequencies (Meta's reference code; transformers' ``rope_type: llama3``): wavelengths
    longer than the original context / low_freq_factor are divided by ``factor``, shorter than original /
    high_freq_factor kept, and the band between interpolated linearly in original_context / wavelength."""
    factor, low, high, original = (float(scaling[k]) for k in ROPE_SCALING_KEYS)
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(
        wavelen < original / high, inv_freq, torch.where(wavelen > original / low, inv_freq / factor, scaled)
    )


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, scaling: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, shape (max_seq_len, head_dim), for the rotate-half (GPT-NeoX/HF Llama) convention."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, heads, T, head_dim) by the angles of its positions (cos, sin: T x head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query self-attention. Under TP each rank holds ``n_heads / tp`` heads and the KV heads they
    use (``n_kv_heads / tp``, or one replicated above ``n_kv_heads`` ranks: model/tp_sharding.py); the output
    projection then gives a partial sum that the caller reduces."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start_pos: int | torch.Tensor = 0):
        batch, seq_len, _ = x.shape
        q = self.wq(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_cache is None:
            mask, is_causal = None, True
        else:
            if isinstance(start_pos, torch.Tensor):
                # static shapes (CUDA graphs): write at tensor positions, attend over the whole masked cache
                query_pos = start_pos + torch.arange(seq_len, device=x.device)
                k, v = self.kv_cache.update_at(query_pos, k, v)
            else:
                k, v = self.kv_cache.update(start_pos, k, v)
                query_pos = torch.arange(start_pos, start_pos + seq_len, device=x.device)
            # query i sits at position start_pos + i and sees keys 0..start_pos + i
            key_pos = torch.arange(k.shape[2], device=x.device)
            mask, is_causal = key_pos[None, :] <= query_pos[:, None], False
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, -1))


class KVCache(nn.Module):
    """A static key/value cache for one attention layer: (batch, kv_heads, max_len, head_dim)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = start_pos + k.shape[2]
        self.k[: k.shape[0], :, start_pos:end] = k
        self.v[: v.shape[0], :, start_pos:end] = v
        return self.k[: k.shape[0], :, :end], self.v[: v.shape[0], :, :end]

    def update_at(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write at tensor ``positions`` and return the whole cache: shapes do not depend on the position."""
        self.k.index_copy_(2, positions, k)
        self.v.index_copy_(2, positions, v)
        return self.k, self.v


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). Under TP each rank holds a slice of the hidden units."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w_gate = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w_up = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w_down = nn.Linear(args.ffn_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    """One layer. ``forward(r, pending_attn, pending_mlp)`` returns the new stream and the outputs that
    the ladder has not added yet (None for the standard and parallel layouts, which add at once)."""

    def __init__(self, args: ModelArgs, layout: str):
        super().__init__()
        self.layout = layout
        self.attention = Attention(args)
        self.mlp = MLP(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        # the parallel layout shares one norm between attention and MLP
        self.mlp_norm = None if layout == "parallel" else RMSNorm(args.dim, args.norm_eps)
        self.comm: Communicator = NO_COMM

    def forward(self, r, cos, sin, pending_attn=None, pending_mlp=None, start_pos: int | torch.Tensor = 0):
        comm = self.comm
        if self.layout == "standard":
            r = r + comm.wait(comm.reduce(self.attention(self.attention_norm(r), cos, sin, start_pos)))
            r = r + comm.wait(comm.reduce(self.mlp(self.mlp_norm(r))))
            return r, None, None
        if self.layout == "parallel":
            n = self.attention_norm(r)
            r = r + comm.wait(comm.reduce(self.attention(n, cos, sin, start_pos) + self.mlp(n)))
            return r, None, None
        # ladder: add the previous layer's attention output, start this layer's attention, then add the
        # previous MLP output, start this MLP; each reduction overlaps the next module's compute. The
        # fences keep the stream behind the module just computed, so a compiler moves no add (hence no
        # wait) and no later module ahead of the compute that should hide the pending all-reduce.
        if pending_attn is not None:
            r = r + comm.wait(pending_attn)
        r, attn_partial = comm.fence(r, self.attention(self.attention_norm(r), cos, sin, start_pos))
        attn_out = comm.reduce(attn_partial)
        if pending_mlp is not None:
            r = r + comm.wait(pending_mlp)
        r, mlp_partial = comm.fence(r, self.mlp(self.mlp_norm(r)))
        return r, attn_out, comm.reduce(mlp_partial)


class Transformer(nn.Module):
    """Decoder-only LM. ``model(input_ids)`` returns fp32 logits of shape (B, T, vocab)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        if args.residual not in RESIDUAL_LAYOUTS:
            raise ValueError(f"residual must be one of {', '.join(RESIDUAL_LAYOUTS)}, got {args.residual!r}")
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, layout) for layout in args.layer_layouts())
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # an untied head is replicated under TP (like the embedding) and sharded by FSDP with the root
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def set_communicator(self, comm: Communicator):
        """Install the reduce hook (tensor parallelism, or the no-communication ceiling) in every block."""
        for layer in self.layers:
            layer.comm = comm

    def param_init_std(self, param_name: str) -> float | None:
        """The init of a parameter by name: N(0, init_std), N(0, init_std / sqrt(2L)) for the two output
        projections of each block, None for norm weights (ones). Works on wrapped names too."""
        if param_name.endswith("norm.weight"):
            return None
        if param_name.endswith(("attention.wo.weight", "mlp.w_down.weight")):
            return self.args.init_std / math.sqrt(2 * self.args.n_layers)
        return self.args.init_std

    @torch.no_grad()
    def init_rope(self):
        cos, sin = rope_tables(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, self.args.rope_scaling)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    @torch.no_grad()
    def init_weights(self):
        """Initialise every parameter by ``init_std`` (in named_parameters order, from torch's global RNG)
        and recompute the rope tables, so a model built on the meta device and moved with ``to_empty`` is
        fully initialised by this call. Sharded models use ``ladder_train.parallel.init_sharded_weights``."""
        self.init_rope()
        for name, param in self.named_parameters():
            std = self.param_init_std(name)
            if std is None:
                nn.init.ones_(param)
            else:
                nn.init.normal_(param, mean=0.0, std=std)

    def forward(
        self, input_ids: torch.Tensor, start_pos: int | torch.Tensor = 0, last_only: bool = False
    ) -> torch.Tensor:
        """``start_pos`` as a 0-d tensor selects the static-shape decode path (the caller checks the length).
        ``last_only``: logits of the last position only (B, 1, vocab), as generation needs; the full fp32
        logits of a long prompt would be batch x prompt x vocab x 4 bytes."""
        seq_len = input_ids.shape[1]
        if isinstance(start_pos, torch.Tensor):
            positions = start_pos + torch.arange(seq_len, device=input_ids.device)
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        else:
            if start_pos + seq_len > self.args.max_seq_len:
                raise ValueError(
                    f"sequence of {start_pos + seq_len} tokens exceeds max_seq_len={self.args.max_seq_len}"
                )
            cos = self.rope_cos[start_pos : start_pos + seq_len]
            sin = self.rope_sin[start_pos : start_pos + seq_len]
        r = self.tok_embeddings(input_ids)
        pending_attn = pending_mlp = None
        for layer in self.layers:
            r, pending_attn, pending_mlp = layer(r, cos, sin, pending_attn, pending_mlp, start_pos)
        if pending_attn is not None:  # the ladder's two last outputs join before the final norm
            comm = self.layers[-1].comm
            r = r + comm.wait(pending_attn) + comm.wait(pending_mlp)
        h = self.norm(r[:, -1:] if last_only else r)
        head = self.tok_embeddings.weight if self.output is None else self.output.weight
        return F.linear(h, head).float()  # fp32 logits: the loss is computed on upcast values

    def setup_kv_cache(self, batch: int, max_len: int, dtype=None, device=None):
        """Give every attention layer a static cache; ``forward(ids, start_pos)`` then decodes incrementally."""
        dtype = dtype or self.tok_embeddings.weight.dtype
        device = device or self.tok_embeddings.weight.device
        for layer in self.layers:
            attn = layer.attention
            kv_heads = attn.wk.weight.shape[0] // attn.head_dim  # the local heads under TP
            attn.kv_cache = KVCache(batch, kv_heads, max_len, attn.head_dim, dtype, device)

    def kv_caches(self) -> list:
        """Every layer's KVCache (None where it has none)."""
        return [layer.attention.kv_cache for layer in self.layers]

    def zero_kv_cache(self):
        """Zero every cache in place: the same tensors, so a CUDA graph that captured their addresses stays valid."""
        for cache in self.kv_caches():
            if cache is not None:
                cache.k.zero_()
                cache.v.zero_()

    def clear_kv_cache(self):
        for layer in self.layers:
            layer.attention.kv_cache = None


def build_on_meta(args: ModelArgs) -> Transformer:
    """The model's structure without storage (shapes for planning, sharding and loading); ``to_empty`` then
    gives it storage, and its weights come from ``init_weights``, a sharded init or a loaded state."""
    with torch.device("meta"):
        return Transformer(args)


# the model's size and cost, from its shape alone: parameters (total, non-embedding), training FLOPs per token (MFU)


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
