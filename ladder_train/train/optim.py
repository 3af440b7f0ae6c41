"""AdamW with the paper's settings and the learning-rate schedules: warmup + cosine (the paper's), or
warmup-stable-decay."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import OptimizerConfig, ScheduleConfig, schedule_steps


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, lr: float | None = None) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (embeddings included), none on norm weights and biases (1-D)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # on a GPU the fused kernel: one launch per parameter group and step instead of foreach's chain of kernels
    fused = bool(decay + no_decay) and all(p.device.type == "cuda" for p in decay + no_decay)
    return torch.optim.AdamW(
        groups, lr=cfg.lr if lr is None else lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None
    )


def freeze_lower_layers(model: nn.Module, n_layers: int) -> None:
    """Keep the first ``n_layers`` blocks fixed (``train.freeze_layers``): their parameters get no gradient and
    no optimizer state. Called before sharding, so FSDP sees which parameters train."""
    for block in model.layers[:n_layers]:
        block.requires_grad_(False)


def resolve_schedule_steps(cfg: ScheduleConfig, tokens_per_step: int) -> tuple[int, int]:
    """(warmup_steps, total_steps), taking the token counts when the recipe gives them."""
    warmup, total, _ = schedule_steps(cfg, tokens_per_step)
    return warmup, total


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer update number ``step`` (1-based): linear warmup to 1 at
    ``warmup``, then cosine decay to ``min_ratio`` at ``total``, flat after."""
    if step <= warmup:
        return step / max(warmup, 1)
    if step >= total:
        return min_ratio
    progress = (step - warmup) / (total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# the wsd decay's shapes: the fraction of (peak - floor) left at decay progress p in [0, 1]
DECAY_SHAPES = {
    "linear": lambda p: 1 - p,
    "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
    "sqrt": lambda p: 1 - math.sqrt(p),
}


def wsd_factor(step: int, warmup: int, total: int, decay: int, min_ratio: float, shape: str) -> float:
    """Warmup-stable-decay: linear warmup to 1 at ``warmup``, 1 until ``total - decay``, then down to ``min_ratio``
    at ``total`` along ``shape`` (DECAY_SHAPES), flat after. Only the step and the totals decide the value, so a
    resumed run continues the schedule, and a larger ``total`` on resume moves the decay later."""
    if step <= warmup:
        return step / max(warmup, 1)
    if step >= total:
        return min_ratio
    progress = max(step - (total - decay), 0) / max(decay, 1)
    return min_ratio + (1 - min_ratio) * DECAY_SHAPES[shape](progress)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, tokens_per_step: int):
    """A LambdaLR whose epoch counter is the number of updates done, so update n uses the factor of step n + 1:
    ``lr_factor`` (cosine) or ``wsd_factor``."""
    warmup, total, decay = schedule_steps(cfg, tokens_per_step)
    shape, ratio = cfg.decay_shape, cfg.min_lr_ratio
    if cfg.kind == "wsd":
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda n: wsd_factor(n + 1, warmup, total, decay, ratio, shape)
        )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: lr_factor(n + 1, warmup, total, ratio))


def apply_schedule(scheduler) -> None:
    """After a resume: set every group's lr to this run's schedule at the restored update count. The optimizer's
    state carries the lr of the schedule it was saved under; a run resumed with a longer total_steps (or another
    schedule) must use its own from the first step. Unchanged settings give the saved values exactly."""
    factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
    values = [base * factor for base, factor in zip(scheduler.base_lrs, factors, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, values, strict=True):
        group["lr"] = lr
    scheduler._last_lr = values  # what get_last_lr() reports (LambdaLR keeps it there)
