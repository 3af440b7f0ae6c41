"""AdamW with the paper's settings and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import OptimizerConfig, ScheduleConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, lr: float | None = None) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (embeddings included), none on norm weights and biases (1-D)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr if lr is None else lr, betas=tuple(cfg.betas), eps=cfg.eps)


def freeze_lower_layers(model: nn.Module, n_layers: int) -> None:
    """Keep the first ``n_layers`` blocks fixed (``train.freeze_layers``): their parameters get no gradient and
    no optimizer state. Called before sharding, so FSDP sees which parameters train."""
    for block in model.layers[:n_layers]:
        block.requires_grad_(False)


def resolve_schedule_steps(cfg: ScheduleConfig, tokens_per_step: int) -> tuple[int, int]:
    """(warmup_steps, total_steps), taking the token counts when the recipe gives them."""
    warmup = cfg.warmup_steps if cfg.warmup_tokens is None else math.ceil(cfg.warmup_tokens / tokens_per_step)
    total = cfg.total_steps if cfg.total_tokens is None else math.ceil(cfg.total_tokens / tokens_per_step)
    return warmup, max(total, warmup, 1)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer update number ``step`` (1-based): linear warmup to 1 at
    ``warmup``, then cosine decay to ``min_ratio`` at ``total``, flat after."""
    if step <= warmup:
        return step / max(warmup, 1)
    if step >= total:
        return min_ratio
    progress = (step - warmup) / (total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup: int, total: int, min_ratio: float):
    """A LambdaLR whose epoch counter is the number of updates done, so update n uses lr_factor(n + 1)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: lr_factor(done + 1, warmup, total, min_ratio))
