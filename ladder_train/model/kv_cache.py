"""The static key/value cache of one attention layer for incremental decoding."""

from __future__ import annotations

import torch
from torch import nn


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
