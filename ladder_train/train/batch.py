"""How the global batch splits over data-parallel ranks and micro-batches, and the compute dtype: what the
trainer and the dry-run planner both need."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ConfigError


@dataclass
class BatchPlan:
    """How the global batch splits: over data-parallel ranks, then into micro-batches."""

    global_batch: int
    micro_batch: int
    dp_world: int
    seq_len: int

    @property
    def per_rank(self) -> int:
        return self.global_batch // self.dp_world

    @property
    def accumulation(self) -> int:
        return self.per_rank // self.micro_batch

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def check(self) -> None:
        if self.global_batch % (self.micro_batch * self.dp_world):
            raise ConfigError(
                f"key 'train.global_batch_size'={self.global_batch} is not a multiple of "
                f"train.micro_batch_size={self.micro_batch} x {self.dp_world} data-parallel ranks"
            )


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """bf16 compute on GPUs, fp32 on the CPU (bf16 is ~30x slower there), unless the recipe insists."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]
