"""The desync layout: rank-local residual streams, an all-reduce only where a pattern says (docs/design.md, "Desync").

A desync model is built for one tensor-parallel degree ``t`` (``desync_tp``). Each TP rank keeps its own residual
stream and adds its own shard's partial module output to it; a module that reduces re-synchronises the ranks:
``x = all_reduce(partial + x_rank / t)``. The model's function therefore depends on ``t``. On one device (training,
or inference at TP 1) the same arithmetic runs as ``t`` emulated streams: a stream tensor (t, B, T, D) whose stream
``s`` goes through shard ``s`` of each module's weights, the same shards ``model/tp_sharding.py`` gives TP rank ``s``.

This module holds which modules reduce, the per-stream projections and ``DesyncBlock``, the layer that owns the
streams (transformer.py builds it for the desync layers). Its attention and MLP are the standard ones (modules.py),
with the same parameter names, so checkpoints, exports and TP sharding see a standard layer's weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .modules import MLP, NO_COMM, Attention, Communicator, RMSNorm

# what a desync layer all-reduces, per layer of an explicit ``desync_pattern``
LAYER_REDUCES = {"none": (False, False), "attention": (True, False), "mlp": (False, True), "both": (True, True)}


def reduce_schedule(n_desync: int, every: int, pattern: list[str] | None) -> list[tuple[bool, bool]]:
    """(attention reduces, MLP reduces) for each of the ``n_desync`` desync layers. ``pattern`` (one LAYER_REDUCES
    key per layer) wins over ``every``: the k-th, 2k-th, ... module reduces, counting the desync layers' modules
    attention, MLP, attention, ... from 1 (every=2: each MLP, the authors' "2x"; every=4: every other MLP, "4x").
    The last module always reduces, so the final norm and the head see one stream."""
    if pattern is not None:
        schedule = [LAYER_REDUCES[p] for p in pattern]
    else:
        schedule = [((2 * i + 1) % every == 0, (2 * i + 2) % every == 0) for i in range(n_desync)]
    if schedule:
        schedule[-1] = (schedule[-1][0], True)
    return schedule


def desync_problems(args, label) -> list[str]:
    """What is wrong with the desync fields of a desync model's ModelArgs ``args`` (sizes already checked), each
    naming the field as ``label(field)`` does. Every check of a shape asks ``ModelArgs.desync_field_problems``, which
    comes here for a desync model."""
    t = args.desync_tp
    if not _is_int(t) or t < 2:
        return [
            f"{label('desync_tp')}={t!r}: a desync model needs the tensor-parallel degree it is built for, "
            "an integer >= 2"
        ]
    for field, value in (("n_heads", args.n_heads), ("ffn_dim", args.ffn_dim)):
        if value % t:
            return [f"{label('desync_tp')}={t}: does not divide {label(field)}={value}"]
    kv = args.n_kv_heads or args.n_heads  # a config keeps None for n_heads
    if (t <= kv and kv % t) or (t > kv and t % kv):
        return [f"{label('desync_tp')}={t}: neither divides nor is a multiple of {label('n_kv_heads')}={kv}"]
    every = args.desync_reduce_every
    if not _is_int(every) or every < 1:
        return [f"{label('desync_reduce_every')}={every!r}: must be an integer >= 1 (2 = each MLP reduces)"]
    n = args.n_layers if args.desync_layers is None else args.desync_layers
    if not _is_int(n) or not 0 <= n <= args.n_layers:
        return [f"{label('desync_layers')}={n!r}: must be an integer in [0, {label('n_layers')}={args.n_layers}]"]
    pattern = args.desync_pattern
    if pattern is not None:
        if not isinstance(pattern, (list, tuple)) or len(pattern) != n:
            return [f"{label('desync_pattern')}={pattern!r:.80}: must list one entry per desync layer ({n})"]
        bad = [p for p in pattern if not isinstance(p, str) or p not in LAYER_REDUCES]
        if bad:
            return [f"{label('desync_pattern')}: {bad[0]!r} is not one of {', '.join(LAYER_REDUCES)}"]
    return []


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def stream_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Streams ``x`` (S, B, T, D) through a weight split by output rows into S shards (stream s by rows
    s * O/S ... (s+1) * O/S, TP rank s's slice): (B, T, O), the S shards' outputs side by side as on the ranks."""
    shards = weight.view(x.shape[0], -1, weight.shape[1])
    return torch.einsum("sbtd,sod->btso", x, shards).flatten(2)


def stream_cols(h: torch.Tensor, weight: torch.Tensor, streams: int) -> torch.Tensor:
    """Each shard's hidden units ``h`` (B, T, S x I) through its input columns of ``weight`` (D, S x I): the S
    partial sums (S, B, T, D) that TP ranks would all-reduce, kept apart."""
    return torch.einsum("btsi,dsi->sbtd", h.unflatten(2, (streams, -1)), weight.view(weight.shape[0], streams, -1))


def stream_kv_weight(weight: torch.Tensor, n_kv_heads: int, streams: int) -> torch.Tensor:
    """wk or wv arranged so that ``stream_rows`` gives stream s the KV heads TP rank s holds: the weight as it is
    when ``streams`` divides the KV heads; above them each stream's one replicated head (s // (streams / n_kv))."""
    if streams <= n_kv_heads:
        return weight
    per_head = weight.view(n_kv_heads, -1, weight.shape[1])
    return per_head.repeat_interleave(streams // n_kv_heads, dim=0).flatten(0, 1)


class DesyncBlock(nn.Module):
    """One desync layer: the standard layer's modules, each adding its partial output to the rank-local streams and
    all-reducing only where ``reduces`` (attention, MLP) says. ``forward`` has ``Block.forward``'s signature, so the
    Transformer runs one loop over both; nothing is pending across layers (desync is built on the standard layout).

    At TP t (``comm.tp_degree == t``) each rank holds its shards and one stream (B, T, D) and the modules run as they
    are. On one device the t streams are emulated: a stream tensor (t, B, T, D), or (B, T, D) while they are
    synchronised, stream s through shard s of every weight (``stream_rows``, ``stream_cols``)."""

    layout = "desync"

    def __init__(self, args, reduces: tuple[bool, bool]):
        super().__init__()
        self.reduce_attention, self.reduce_mlp = reduces
        self.desync_tp = args.desync_tp
        # the standard Block's modules in its order: the same names, and the same draws from the init's RNG
        self.attention = Attention(args)
        self.mlp = MLP(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp_norm = RMSNorm(args.dim, args.norm_eps)
        self.comm: Communicator = NO_COMM

    def forward(self, r, cos, sin, pending_attn=None, pending_mlp=None, start_pos: int | torch.Tensor = 0):
        streams = self.desync_tp // self.comm.tp_degree  # t emulated on one device, one per rank at TP t

        def attend(x):
            return self.stream_attention(x, cos, sin, start_pos, streams)

        def feed_forward(x):
            return self.stream_mlp(x, streams)

        r = self.module_step(r, attend, self.attention_norm, self.reduce_attention, streams)
        return self.module_step(r, feed_forward, self.mlp_norm, self.reduce_mlp, streams), None, None

    def module_step(self, r, module, norm, reduce: bool, streams: int) -> torch.Tensor:
        """One module: each stream adds its own shard's partial output, or, where the module reduces, the ranks
        re-synchronise on all_reduce(partial + stream / t). ``r``: the rank's stream (B, T, D) at TP t; on one device
        the t emulated streams (t, B, T, D), or (B, T, D) while they are synchronised."""
        x = norm(r)
        if streams > 1 and x.dim() == 3:  # synchronised: every shard reads the same stream
            x = x.expand(streams, *x.shape)
        partial = module(x)
        if not reduce:
            return r + partial
        if streams == 1:
            return self.comm.wait(self.comm.reduce(partial + r / self.desync_tp))
        return (partial + r / self.desync_tp).sum(0)  # the all-reduce of the t ranks, done in place

    def stream_attention(self, x, cos, sin, start_pos, streams: int) -> torch.Tensor:
        """The attention's partial output: the module itself on a rank's stream (B, T, D); on the emulated streams
        (S, B, T, D), stream s through TP rank s's heads, the S partials (S, B, T, D) kept apart."""
        attention = self.attention
        if streams == 1:
            return attention(x, cos, sin, start_pos)
        q = stream_rows(x, attention.wq.weight)
        k = stream_rows(x, stream_kv_weight(attention.wk.weight, attention.n_kv_heads, streams))
        v = stream_rows(x, stream_kv_weight(attention.wv.weight, attention.n_kv_heads, streams))
        return stream_cols(attention.attend(q, k, v, cos, sin, start_pos), attention.wo.weight, streams)

    def stream_mlp(self, x, streams: int) -> torch.Tensor:
        """The MLP's partial output, as ``stream_attention``: stream s through TP rank s's hidden units."""
        mlp = self.mlp
        if streams == 1:
            return mlp(x)
        hidden = F.silu(stream_rows(x, mlp.w_gate.weight)) * stream_rows(x, mlp.w_up.weight)
        return stream_cols(hidden, mlp.w_down.weight, streams)
