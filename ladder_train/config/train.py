"""``train.*``: the batch, the optimizer and its schedule, the compute dtype, and the stability guard's settings, with
the rules among them (a micro-batch that divides the global batch, a warmup within the schedule, two betas in
[0, 1), watched values the guard knows)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from .schema import bounded, choice


@dataclass
class OptimizerConfig:
    # peak learning rate
    lr: float = bounded(3e-4, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0 trains nothing)")
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's (beta1, beta2), each in [0, 1)
    eps: float = bounded(1e-10, lambda v: v > 0, "positive")  # AdamW's epsilon
    # not applied to norm weights or biases; embeddings are decayed
    weight_decay: float = bounded(0.1, lambda v: v >= 0, ">= 0")
    # max global gradient norm; 0 disables clipping
    grad_clip: float = bounded(1.0, lambda v: v >= 0, ">= 0 (0 = no clipping)")


@dataclass
class ScheduleConfig:
    # cosine: linear warmup, then cosine decay to min_lr_ratio x peak at total_steps |
    # wsd (warmup-stable-decay): linear warmup, the peak held, then a decay of decay_shape over the last steps
    kind: str = choice("cosine", ("cosine", "wsd"))
    warmup_steps: int = bounded(2000, lambda v: v >= 0, ">= 0")  # linear warmup from 0 to the peak lr
    total_steps: int = bounded(25000, lambda v: v >= 1, "at least 1")  # the decay ends here, at min_lr_ratio x peak
    min_lr_ratio: float = 0.1  # the learning rate at the end of the decay, as a fraction of the peak (in [0, 1])
    # if set (e.g. 8e9), overrides warmup_steps (tokens / global batch tokens)
    warmup_tokens: float | None = bounded(None, lambda v: v is None or v >= 0, ">= 0, or null")
    # if set (e.g. 100e9), overrides total_steps
    total_tokens: float | None = bounded(None, lambda v: v is None or v > 0, "positive, or null")
    # wsd: the decay's shape from peak to min_lr_ratio x peak over progress p in [0, 1]: linear (1 - p) |
    # cosine | sqrt (1 - sqrt(p): held near the peak longer, then steeper; Hagele et al. 2024 found it beats linear)
    decay_shape: str = choice("sqrt", ("linear", "cosine", "sqrt"))
    # wsd: the decay's length as a fraction of total_steps (rounded to steps)
    decay_fraction: float = bounded(0.2, lambda v: 0 < v <= 1, "in (0, 1]")
    # wsd: the decay's length in steps; overrides decay_fraction when set
    decay_steps: int | None = bounded(None, lambda v: v is None or v >= 1, "at least 1, or null for decay_fraction")


@dataclass
class SpikeConfig:
    """``train.spike.*``: loss-spike detection. A step is a spike when a watched value (the all-reduced loss or
    the gradient norm, the same on every rank) lies more than ``threshold`` standard deviations above the mean
    of the previous ``window`` steps' finite values (train/stability.py)."""

    enabled: bool = False  # off: no detector runs, and no spike fields are logged
    # steps in the rolling mean and standard deviation; nothing fires before it is full
    window: int = bounded(100, lambda v: v >= 2, "at least 2 (a standard deviation needs two values)")
    # the z-score above which a step is a spike (one-sided: only rises count)
    threshold: float = bounded(6.0, lambda v: math.isfinite(v) and v > 0, "a finite number > 0 (standard deviations)")
    watch: list[str] = field(default_factory=lambda: ["loss", "grad_norm"])  # the values tested: loss, grad_norm
    # log: report it and train on | skip: report it, no update (the batch counts as consumed) | stop: report it,
    # record the batch in RUN_DIR/skip_batches.json and stop (exit 1); a rerun resumes and skips that batch
    action: str = choice("log", ("log", "skip", "stop"))


@dataclass
class TrainConfig:
    global_batch_size: int = 2048  # sequences per optimizer step, over all data-parallel ranks
    micro_batch_size: int = 4  # sequences per forward/backward on one rank; accumulation makes up the rest
    # stop early (smoke runs); None = schedule.total_steps
    max_steps: int | None = bounded(
        None, lambda v: v is None or v >= 1, "at least 1, or null for the schedule's total_steps"
    )
    log_every: int = 10  # steps between metric lines
    # compute dtype: auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    dtype: str = choice("auto", ("auto", "bf16", "fp32"))
    # NaN/inf loss or grad norm: skip the step up to this many times, then stop
    max_nonfinite_skips: int = bounded(0, lambda v: v >= 0, ">= 0")
    # keep the first K transformer blocks fixed (adapting a pretrained model: only the upper layers learn);
    # embeddings, the output head and the final norm still train
    freeze_layers: int = 0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    spike: SpikeConfig = field(default_factory=SpikeConfig)


SPIKE_WATCHABLE = ("loss", "grad_norm")


def schedule_steps(s: ScheduleConfig, tokens_per_step: int) -> tuple[int, int, int]:
    """(warmup, total, decay) steps of ``train.schedule``: token counts win over step counts; ``decay`` is the length
    of a wsd schedule's decay (0 for cosine, which decays from the end of warmup). The trainer's rule too."""
    warmup = s.warmup_steps if s.warmup_tokens is None else math.ceil(s.warmup_tokens / tokens_per_step)
    total = max(s.total_steps if s.total_tokens is None else math.ceil(s.total_tokens / tokens_per_step), warmup, 1)
    if s.kind != "wsd":
        return warmup, total, 0
    return warmup, total, s.decay_steps if s.decay_steps is not None else max(1, round(s.decay_fraction * total))


def check_train(t: TrainConfig) -> None:
    """The rules among ``train.*``'s own fields."""
    if t.log_every <= 0:
        raise ConfigError(f"key 'train.log_every' must be a positive number of steps, got {t.log_every}")
    if t.micro_batch_size <= 0 or t.global_batch_size <= 0:
        raise ConfigError("keys 'train.global_batch_size' and 'train.micro_batch_size' must be positive")
    if t.global_batch_size % t.micro_batch_size:
        raise ConfigError(
            f"key 'train.micro_batch_size'={t.micro_batch_size} does not divide train.global_batch_size={t.global_batch_size}"
        )
    betas = list(t.optimizer.betas)
    if len(betas) != 2:
        raise ConfigError(f"key 'train.optimizer.betas' needs two values, got {betas}")
    if not all(0 <= beta < 1 for beta in betas):
        raise ConfigError(f"key 'train.optimizer.betas' must lie in [0, 1), got {betas}")
    s = t.schedule
    if s.warmup_steps > s.total_steps:
        raise ConfigError(
            f"keys 'train.schedule.warmup_steps'={s.warmup_steps} and 'total_steps'={s.total_steps} need warmup <= total"
        )
    if not 0 <= s.min_lr_ratio <= 1:
        raise ConfigError(f"key 'train.schedule.min_lr_ratio' must lie in [0, 1], got {s.min_lr_ratio}")
    watch = list(t.spike.watch)
    if not watch or any(name not in SPIKE_WATCHABLE for name in watch):
        raise ConfigError(
            f"key 'train.spike.watch' must be a non-empty list of {', '.join(SPIKE_WATCHABLE)}, got {watch}"
        )
