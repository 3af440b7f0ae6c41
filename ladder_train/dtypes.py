"""Compute dtypes by the names recipes and flags use, and the one rule for ``auto``."""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """bf16 compute on GPUs, fp32 on the CPU unless the recipe insists: CPU bf16 speed depends on the chip's
    bf16 instructions (1.4x faster than fp32 on an AVX512-BF16 EPYC, docs/benchmarks.md), and the tests and
    demo compare against fp32 references."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]
