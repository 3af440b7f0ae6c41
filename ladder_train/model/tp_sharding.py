"""The tensor-parallel sharding plan (Megatron style; docs/design.md, "Tensor parallelism"): q, k, v, gate and up
are split by output rows (each rank holds whole heads and a slice of the MLP hidden units); the attention output
and the down projection by input columns, so each module gives a partial sum per rank. Embeddings and norms are
replicated.

KV heads: a TP degree dividing ``n_kv_heads`` gives each rank ``n_kv_heads / tp`` of them. A degree above
``n_kv_heads`` and a multiple of it replicates them, as vLLM and SGLang do: each rank holds ONE KV head, the one its
``n_heads / tp`` query heads share in grouped-query attention (query head q uses KV head q // (n_heads / n_kv_heads)),
so rank r holds KV head r // (tp / n_kv_heads), and each KV head sits on tp / n_kv_heads ranks (its weights and
its KV cache included)."""

from __future__ import annotations

import torch

from ..errors import InputError
from .transformer import ModelArgs

# parameter name suffix -> the dimension split across TP ranks (0 = output rows, 1 = input columns)
SHARD_DIMS = {
    "attention.wq.weight": 0,
    "attention.wk.weight": 0,
    "attention.wv.weight": 0,
    "mlp.w_gate.weight": 0,
    "mlp.w_up.weight": 0,
    "attention.wo.weight": 1,
    "mlp.w_down.weight": 1,
}
KV_WEIGHTS = ("attention.wk.weight", "attention.wv.weight")


def check_tp_degree(args: ModelArgs, tp: int, source: str = "model"):
    """Fail before any loading when ``tp`` cannot split the heads or MLP hidden units evenly, or can neither split
    the KV heads evenly (``tp`` dividing ``n_kv_heads``) nor replicate them evenly (a multiple of ``n_kv_heads``),
    or a desync model is asked for a degree other than its own (or 1, its emulation)."""
    if args.residual == "desync" and tp not in (1, args.desync_tp):
        raise InputError(
            f"{source}: a desync model is built for tensor-parallel degree {args.desync_tp} (its residual streams); "
            f"it runs at TP {args.desync_tp}, or emulated at TP 1, not at TP {tp}"
        )
    for field in ("n_heads", "ffn_dim"):
        value = getattr(args, field)
        if value % tp:
            raise InputError(f"{source}: tensor-parallel degree {tp} does not divide {field}={value}")
    n_kv = args.n_kv_heads
    if tp <= n_kv and n_kv % tp:
        raise InputError(
            f"{source}: tensor-parallel degree {tp} does not divide n_kv_heads={n_kv} (n_heads={args.n_heads}): "
            "the KV heads cannot be split evenly"
        )
    if tp > n_kv and tp % n_kv:
        raise InputError(
            f"{source}: tensor-parallel degree {tp} is above n_kv_heads={n_kv} (n_heads={args.n_heads}) but not a "
            "multiple of it: the KV heads cannot be replicated evenly"
        )


def local_kv_heads(n_kv_heads: int, tp: int) -> int:
    """KV heads per rank: ``n_kv_heads / tp``, or 1 (replicated) when ``tp`` is above ``n_kv_heads``."""
    return max(1, n_kv_heads // tp)


def kv_heads_of_rank(args: ModelArgs, rank: int, tp: int) -> range:
    """The KV heads TP rank ``rank`` holds (of a degree ``check_tp_degree`` accepts)."""
    if tp <= args.n_kv_heads:
        per_rank = args.n_kv_heads // tp
        return range(rank * per_rank, (rank + 1) * per_rank)
    head = rank // (tp // args.n_kv_heads)
    return range(head, head + 1)


def shard_dim(name: str) -> int | None:
    """The dimension of parameter ``name`` split across TP ranks, or None if it is replicated."""
    for suffix, dim in SHARD_DIMS.items():
        if name.endswith(suffix):
            return dim
    return None


def shard_slice(shape: torch.Size, dim: int, rank: int, tp: int) -> tuple[slice, ...]:
    size = shape[dim] // tp
    index = [slice(None)] * len(shape)
    index[dim] = slice(rank * size, (rank + 1) * size)
    return tuple(index)


def shard_index(name: str, shape: torch.Size, args: ModelArgs, rank: int, tp: int) -> tuple[slice, ...] | None:
    """TP rank ``rank``'s part of parameter ``name`` (full shape ``shape``) as an index, or None if the rank holds
    it whole. wk and wv above ``n_kv_heads`` ranks: the rows of the rank's one KV head."""
    dim = shard_dim(name)
    if dim is None:
        return None
    if tp > args.n_kv_heads and name.endswith(KV_WEIGHTS):
        heads = kv_heads_of_rank(args, rank, tp)
        return slice(heads.start * args.head_dim, heads.stop * args.head_dim), slice(None)
    return shard_slice(shape, dim, rank, tp)
