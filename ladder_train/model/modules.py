"""What every block is made of: the RMSNorm, the attention with its rotary embeddings and the SwiGLU MLP (the two
*modules* of a layer), the ``Communicator`` that turns a module's partial output into the full sum under tensor
parallelism, and the trainer's loss on the final hidden states (``TokenLoss``).

The modules see one stream, (batch, seq, dim); the layouts that arrange them are the blocks: ``Block`` in
transformer.py (standard, parallel, ladder) and ``DesyncBlock`` in desync.py. Each module takes a ``ModelArgs``
(transformer.py) for its sizes; it is not imported here, as transformer.py and desync.py import this module.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import KVCache


class Communicator:
    """Turns a module's partial output into the full sum. This base class is the no-TP case: identity.

    ``reduce(x)`` starts the reduction of ``x`` and returns a tensor to hand to ``wait`` later;
    ``wait(x)`` returns the reduced tensor. Layouts that add an output at once call ``wait(reduce(x))``;
    the ladder calls ``reduce`` when the module finishes and ``wait`` one module later.
    ``tp_degree``: how many ranks hold the modules' shards (a desync block emulates desync_tp / tp_degree streams).
    """

    tp_degree = 1

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def wait(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def fence(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tensors unchanged: a point they pass together. A compiler hint only (see the TP communicator):
        nothing that reads them afterwards may be moved before all of them have been computed."""
        return tensors


NO_COMM = Communicator()


def join_rows(module: nn.Module, name: str, linears: tuple[nn.Linear, ...]) -> list[int]:
    """One weight for several bias-free linears that read the same input, so that one matrix product computes all
    their outputs: a non-persistent buffer ``name`` of ``module`` holding their rows in order, each linear's weight
    rebound as a view of its rows (names, state_dict and the values unchanged, no second copy). Returns each one's
    row count, to split the product's output. For inference: training's autograd would see views of a buffer."""
    rows = [linear.weight.shape[0] for linear in linears]
    with torch.no_grad():
        joined = torch.cat([linear.weight for linear in linears])
    module.register_buffer(name, joined, persistent=False)
    for linear, part in zip(linears, joined.split(rows), strict=True):
        linear.weight = nn.Parameter(part, requires_grad=False)
    return rows


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


# rotary position embeddings (rotate-half, the GPT-NeoX / Hugging Face Llama convention) and Llama-3.1's
# frequency scaling
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

    def __init__(self, args):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.kv_cache: KVCache | None = None
        self.qkv_rows: list[int] | None = None  # set by fuse_projections

    def fuse_projections(self) -> None:
        """Q, K and V from one matrix product (join_rows): a decode step launches one kernel for them, not three."""
        self.qkv_rows = join_rows(self, "wqkv", (self.wq, self.wk, self.wv))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start_pos: int | torch.Tensor = 0):
        """``x``: (B, T, D); the output projection's (partial) sum (B, T, D)."""
        if self.qkv_rows is None:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        else:
            q, k, v = F.linear(x, self.wqkv).split(self.qkv_rows, dim=-1)
        return self.wo(self.attend(q, k, v, cos, sin, start_pos))

    def attend(self, q, k, v, cos, sin, start_pos: int | torch.Tensor = 0) -> torch.Tensor:
        """The attention of projected queries, keys and values (B, T, heads x head_dim each, k and v over the KV
        heads): rope, the cache, causal SDPA. Returns (B, T, heads x head_dim), the output projection's input."""
        batch, seq_len = q.shape[:2]
        q = q.view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_cache is None:
            mask, is_causal = None, True
        else:
            if isinstance(start_pos, torch.Tensor):
                # static shapes (CUDA graphs): write at tensor positions, attend over the whole masked cache
                query_pos = start_pos + torch.arange(seq_len, device=q.device)
                k, v = self.kv_cache.update_at(query_pos, k, v)
            else:
                k, v = self.kv_cache.update(start_pos, k, v)
                query_pos = torch.arange(start_pos, start_pos + seq_len, device=q.device)
            # query i sits at position start_pos + i and sees keys 0..start_pos + i
            key_pos = torch.arange(k.shape[2], device=q.device)
            mask, is_causal = key_pos[None, :] <= query_pos[:, None], False
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return out.transpose(1, 2).reshape(batch, seq_len, -1)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). Under TP each rank holds a slice of the hidden units."""

    def __init__(self, args):
        super().__init__()
        self.w_gate = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w_up = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w_down = nn.Linear(args.ffn_dim, args.dim, bias=False)
        self.gate_up_rows: list[int] | None = None  # set by fuse_projections

    def fuse_projections(self) -> None:
        """Gate and up from one matrix product (join_rows): one kernel for them, not two."""
        self.gate_up_rows = join_rows(self, "w_gate_up", (self.w_gate, self.w_up))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (B, T, D); the down projection's (partial) sum (B, T, D)."""
        if self.gate_up_rows is None:
            gate, up = self.w_gate(x), self.w_up(x)
        else:
            gate, up = F.linear(x, self.w_gate_up).split(self.gate_up_rows, dim=-1)
        return self.w_down(F.silu(gate) * up)


IGNORE_INDEX = -100  # the label of a token that is not scored (torch's cross_entropy default)


class TokenLoss(nn.Module):
    """The summed cross-entropy of the scored labels (not IGNORE_INDEX), from the final hidden states and the head,
    on logits upcast to fp32. A module of its own so that parallel.apply_compile compiles it: inductor then upcasts
    inside the softmax's reductions and keeps only the bf16 logits for the backward, where eager materialises the
    fp32 logits, their log-softmax and its gradient (memory_plan.activation_bytes counts either)."""

    def forward(self, h: torch.Tensor, head: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, head).float()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
