"""The tensor-parallel sharding plan (Megatron style; docs/design.md, "Tensor parallelism"): q, k, v, gate and up
are split by output rows (each rank holds whole heads and a slice of the MLP hidden units); the attention output
and the down projection by input columns, so each module gives a partial sum per rank. Embeddings and norms are
replicated."""

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


def check_tp_degree(args: ModelArgs, tp: int, source: str = "model"):
    """Fail before any loading when ``tp`` cannot split the heads, kv heads or MLP hidden units evenly."""
    for field in ("n_heads", "n_kv_heads", "ffn_dim"):
        value = getattr(args, field)
        if value % tp:
            raise InputError(f"{source}: tensor-parallel degree {tp} does not divide {field}={value}")


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
