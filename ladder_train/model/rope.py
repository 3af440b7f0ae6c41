"""Rotary position embeddings (rotate-half, the GPT-NeoX / Hugging Face Llama convention) and Llama-3.1's
frequency scaling."""

from __future__ import annotations

import math

import torch

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
