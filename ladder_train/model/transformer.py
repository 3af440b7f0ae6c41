"""The one Transformer definition of ladder-train, used by training and by inference.

Pre-norm decoder: RMSNorm, rotary embeddings (rotate-half convention), grouped-query attention through
``F.scaled_dot_product_attention``, SwiGLU MLP, no biases, tied input/output embeddings. Three residual
layouts (docs/design.md has the equations):

    standard  r = r + A(r);  r = r + M(r)
    parallel  n = norm(r);   r = r + A(n) + M(n)
    ladder    each module's output joins the stream one module late, so its all-reduce can overlap
              the next module's compute under tensor parallelism.

``Block`` holds these three; the fourth, desync (built for TP degree t: each rank keeps its own stream and
all-reduces only where a pattern says), is its own block class, ``DesyncBlock`` in model/desync.py. The modules
the blocks are made of (norm, attention with its rotary tables, MLP) and the loss are in model/modules.py; the
parameter count and FLOPs per token of a shape (``count_params``, ``flops_per_token``) end this file.

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

from .desync import DesyncBlock, desync_problems, reduce_schedule
from .kv_cache import KVCache
from .modules import MLP, NO_COMM, Attention, Communicator, RMSNorm, TokenLoss, rope_tables

RESIDUAL_LAYOUTS = ("standard", "parallel", "ladder", "desync")
DESYNC_FIELDS = ("desync_tp", "desync_layers", "desync_pattern")  # null unless residual is desync
# the layouts that need no further field: what the demo, the benchmark and the predictor run by default
PAPER_LAYOUTS = ("standard", "parallel", "ladder")


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
    residual: str = field(default="standard", metadata={"choices": RESIDUAL_LAYOUTS})  # standard|parallel|ladder|desync
    ladder_layers: int | None = None  # ladder only: the last N layers are ladder, the rest standard; None = all
    # desync only: the tensor-parallel degree t the model is built and served at (its t residual streams)
    desync_tp: int | None = None
    # desync only: every k-th module of the desync layers all-reduces (attention, MLP, attention, ... counted from
    # 1): 2 = each MLP (the authors' "2x"), 4 = every other MLP ("4x"), 1 = every module; the last module always does
    desync_reduce_every: int = 2
    # desync only: per desync layer, which modules all-reduce (none | attention | mlp | both); wins over reduce_every
    desync_pattern: list[str] | None = None
    desync_layers: int | None = None  # desync only: the last N layers are desync, the rest standard; None = all
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
        """The residual layout of each layer: a hybrid ladder or desync keeps its first L - N layers standard."""
        if self.residual not in ("ladder", "desync"):
            return [self.residual] * self.n_layers
        hybrid = self.ladder_layers if self.residual == "ladder" else self.desync_layers
        n_upper = self.n_layers if hybrid is None else hybrid
        return ["standard"] * (self.n_layers - n_upper) + [self.residual] * n_upper

    def desync_field_problems(self, label) -> list[str]:
        """What is wrong with the desync fields (sizes already checked), each naming the field as ``label(field)``
        does: on a desync model, desync.py's ``desync_problems``; on any other, a desync field that is set. Shared by
        the config check, the model folder check and the exported class's check."""
        if self.residual == "desync":
            return desync_problems(self, label)
        for name in DESYNC_FIELDS:
            if getattr(self, name) is not None:
                return [
                    f"{label(name)}={getattr(self, name)!r}: only a desync model has it (null for "
                    f"{label('residual')}={self.residual!r})"
                ]
        return []

    def layer_reduces(self) -> list[tuple[bool, bool]]:
        """(attention all-reduces, MLP all-reduces) of each layer under TP: both, except in desync layers."""
        layouts = self.layer_layouts()
        n_desync = layouts.count("desync")
        schedule = reduce_schedule(n_desync, self.desync_reduce_every, self.desync_pattern) if n_desync else []
        return [(True, True)] * (len(layouts) - n_desync) + schedule


class Block(nn.Module):
    """One layer of the paper's layouts (standard, parallel, ladder). ``forward(r, pending_attn, pending_mlp)``
    returns the new stream and the outputs that the ladder has not added yet (None for the standard and parallel
    layouts, which add at once)."""

    def __init__(self, args: ModelArgs, layout: str):
        super().__init__()
        if layout not in PAPER_LAYOUTS:
            raise ValueError(f"Block holds {', '.join(PAPER_LAYOUTS)}, not {layout!r} (desync: model/desync.py)")
        self.layout = layout
        self.attention = Attention(args)
        self.mlp = MLP(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        # the parallel layout shares one norm between attention and MLP
        self.mlp_norm = None if layout == "parallel" else RMSNorm(args.dim, args.norm_eps)
        self.comm: Communicator = NO_COMM

    def forward(self, r, cos, sin, pending_attn=None, pending_mlp=None, start_pos: int | torch.Tensor = 0):
        comm = self.comm
        if self.layout == "standard":  # docs/design.md, "Standard": r = r + A(norm_a(r)); r = r + M(norm_m(r))
            r = r + comm.wait(comm.reduce(self.attention(self.attention_norm(r), cos, sin, start_pos)))
            r = r + comm.wait(comm.reduce(self.mlp(self.mlp_norm(r))))
            return r, None, None
        if self.layout == "parallel":  # docs/design.md, "Parallel attention": n = norm(r); r = r + A(n) + M(n)
            n = self.attention_norm(r)
            r = r + comm.wait(comm.reduce(self.attention(n, cos, sin, start_pos) + self.mlp(n)))
            return r, None, None
        # ladder (docs/design.md, "Ladder"): add the previous layer's attention output, start this layer's
        # attention, then add the previous MLP output, start this MLP; each reduction overlaps the next module's
        # compute. The fences keep the stream behind the module just computed, so a compiler moves no add (hence no
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
    """Decoder-only LM. ``model(input_ids)`` returns fp32 logits of shape (B, T, vocab); ``model(input_ids,
    labels=labels)`` the summed token loss instead, without a logits tensor leaving the model (training)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        if args.residual not in RESIDUAL_LAYOUTS:
            raise ValueError(f"residual must be one of {', '.join(RESIDUAL_LAYOUTS)}, got {args.residual!r}")
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # a layer's layout picks its class: the desync layers own their rank-local streams (model/desync.py)
        self.layers = nn.ModuleList(
            DesyncBlock(args, reduces) if layout == "desync" else Block(args, layout)
            for layout, reduces in zip(args.layer_layouts(), args.layer_reduces(), strict=True)
        )
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # an untied head is replicated under TP (like the embedding) and sharded by FSDP with the root
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        self.loss = TokenLoss()
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
        self,
        input_ids: torch.Tensor,
        start_pos: int | torch.Tensor = 0,
        last_only: bool = False,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``start_pos`` as a 0-d tensor selects the static-shape decode path (the caller checks the length).
        ``last_only``: logits of the last position only (B, 1, vocab), as generation needs; the full fp32
        logits of a long prompt would be batch x prompt x vocab x 4 bytes. ``labels`` (B, T): the summed loss
        of the scored labels (TokenLoss) instead of the logits."""
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
        if labels is not None:
            return self.loss(h, head, labels)
        return F.linear(h, head).float()  # fp32 logits: a loss is computed on upcast values

    @torch.no_grad()
    def fuse_projections(self):
        """For inference: every layer's Q, K and V, and its gate and up, each from one matrix product (the modules'
        fuse_projections), once the weights are loaded and placed; the parameters stay, as views."""
        for layer in self.layers:
            layer.attention.fuse_projections()
            layer.mlp.fuse_projections()

    def setup_kv_cache(self, batch: int, max_len: int, dtype=None, device=None):
        """Give every attention layer a static cache; ``forward(ids, start_pos)`` then decodes incrementally."""
        dtype = dtype or self.tok_embeddings.weight.dtype
        device = device or self.tok_embeddings.weight.device
        for layer in self.layers:
            attn = layer.attention
            kv_heads = attn.wk.weight.shape[0] // attn.head_dim  # the local heads under TP
            if layer.layout == "desync" and layer.comm.tp_degree == 1:
                kv_heads = max(kv_heads, self.args.desync_tp)  # emulated streams above n_kv_heads: one head each
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


# a model's size and training cost from its shape alone (no allocation): the dry run, the meter's MFU, the predictor


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
