"""The constraints on a config that no type can express: choices, divisibility, ranges. Each refusal is one line
naming the key and the value (``ConfigError``)."""

from __future__ import annotations

import math

from .errors import ConfigError
from .folders import is_token_folder
from .model import RESIDUAL_LAYOUTS

# values restricted to a set of choices: dotted key -> choices
CHOICES = {
    "model.residual": RESIDUAL_LAYOUTS,
    "train.dtype": ("auto", "bf16", "fp32"),
    "data.format": ("text", "chat"),
    "parallel.activation_checkpoint": ("none", "full", "every_n", "selective"),
    "train.schedule.kind": ("cosine", "wsd"),
    "train.schedule.decay_shape": ("linear", "cosine", "sqrt"),
    "train.spike.action": ("log", "skip", "stop"),
    "wandb.mode": ("online", "offline", "disabled"),
    "eval.mode": ("inprocess", "slurm"),
}


# number ranges: dotted key -> (test, what the value must be); None passes where the key allows it
RANGES = {
    "data.seq_len": (lambda v: v >= 1, "at least 1"),
    "data.num_workers": (lambda v: v >= 0, ">= 0 (0 = tokenize in the trainer)"),
    "data.shuffle_buffer": (lambda v: v >= 0, ">= 0 (0 = no shuffling)"),
    "train.max_steps": (lambda v: v is None or v >= 1, "at least 1, or null for the schedule's total_steps"),
    "train.max_nonfinite_skips": (lambda v: v >= 0, ">= 0"),
    "train.optimizer.lr": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0 trains nothing)"),
    "train.optimizer.eps": (lambda v: v > 0, "positive"),
    "train.optimizer.weight_decay": (lambda v: v >= 0, ">= 0"),
    "train.optimizer.grad_clip": (lambda v: v >= 0, ">= 0 (0 = no clipping)"),
    "train.schedule.warmup_tokens": (lambda v: v is None or v >= 0, ">= 0, or null"),
    "train.schedule.total_tokens": (lambda v: v is None or v > 0, "positive, or null"),
    "train.schedule.decay_fraction": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "train.schedule.decay_steps": (lambda v: v is None or v >= 1, "at least 1, or null for decay_fraction"),
    "train.spike.window": (lambda v: v >= 2, "at least 2 (a standard deviation needs two values)"),
    "train.spike.threshold": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0 (standard deviations)"),
    "parallel.ac_every": (lambda v: v >= 1, "at least 1"),
    "checkpoint.every": (lambda v: v >= 0, ">= 0 (0 = only at the end)"),
    "eval.every": (lambda v: v >= 0, ">= 0 (0 = only at the end)"),
    "eval.val_every": (lambda v: v >= 0, ">= 0 (0 = never)"),
    "eval.val_batches": (lambda v: v >= 1, "at least 1"),
    "eval.batch_size": (lambda v: v >= 1, "at least 1"),
    "eval.limit": (lambda v: v is None or v >= 1, "at least 1, or null for every row"),
    "model.init_std": (lambda v: v > 0, "positive"),
    "model.rope_theta": (lambda v: v > 0, "positive"),
    "model.norm_eps": (lambda v: v > 0, "positive"),
    "profile.wait": (lambda v: v >= 0, ">= 0"),
    "profile.warmup": (lambda v: v >= 0, ">= 0"),
    "profile.active": (lambda v: v >= 1, "at least 1"),
    "profile.repeat": (lambda v: v >= 0, ">= 0 (0 = until the run ends)"),
    "profile.memory_snapshot_step": (
        lambda v: v is None or v >= 0,
        ">= 0 (0 = only at an OutOfMemoryError), or null for no recording",
    ),
}


def _value(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _check_ranges(cfg) -> None:
    for dotted, (ok, words) in RANGES.items():
        value = _value(cfg, dotted)
        if not ok(value):
            raise ConfigError(f"key '{dotted}' must be {words}, got {value!r}")
    betas = list(cfg.train.optimizer.betas)
    if not all(0 <= beta < 1 for beta in betas):
        raise ConfigError(f"key 'train.optimizer.betas' must lie in [0, 1), got {betas}")


def check_values(cfg) -> None:
    """Constraints no type can express: choices, divisibility, positive sizes."""
    for dotted, choices in CHOICES.items():
        value = _value(cfg, dotted)
        if value not in choices:
            raise ConfigError(f"key '{dotted}' must be one of {', '.join(choices)}, got {value!r}")
    _check_model(cfg.model, cfg.data.seq_len)
    _check_training(cfg)
    _check_ranges(cfg)
    _check_stability_and_schedule(cfg)
    _check_data_sources(cfg)


def _check_model(m, seq_len: int) -> None:
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim", "max_seq_len"):
        if getattr(m, name) <= 0:
            raise ConfigError(f"key 'model.{name}' must be positive, got {getattr(m, name)}")
    if m.dim % m.n_heads:
        raise ConfigError(f"key 'model.n_heads'={m.n_heads} does not divide model.dim={m.dim}")
    if (m.dim // m.n_heads) % 2:
        raise ConfigError(
            f"head dim model.dim / model.n_heads = {m.dim // m.n_heads} must be even for rotary embeddings"
        )
    kv_heads = m.n_kv_heads if m.n_kv_heads is not None else m.n_heads
    if kv_heads <= 0 or m.n_heads % kv_heads:
        raise ConfigError(
            f"key 'model.n_kv_heads'={m.n_kv_heads} must be positive and divide model.n_heads={m.n_heads}"
        )
    if m.ladder_layers is not None:
        if m.residual != "ladder":
            raise ConfigError(f"key 'model.ladder_layers' is set but model.residual is {m.residual!r}, not 'ladder'")
        if not 0 <= m.ladder_layers <= m.n_layers:
            raise ConfigError(
                f"key 'model.ladder_layers'={m.ladder_layers} must lie in [0, model.n_layers={m.n_layers}]"
            )
    if seq_len > m.max_seq_len:
        raise ConfigError(f"key 'data.seq_len'={seq_len} exceeds model.max_seq_len={m.max_seq_len}")


def _check_training(cfg) -> None:
    m, t = cfg.model, cfg.train
    if t.log_every <= 0:
        raise ConfigError(f"key 'train.log_every' must be a positive number of steps, got {t.log_every}")
    if cfg.data.format == "chat" and not cfg.data.chat_template:
        raise ConfigError(
            "key 'data.chat_template' is required with data.format=chat: a model folder whose tokenizer_config.json "
            "holds the chat template"
        )
    if cfg.parallel.timeout_s <= 0:
        raise ConfigError(
            f"key 'parallel.timeout_s' must be a positive number of seconds, got {cfg.parallel.timeout_s}"
        )
    if t.micro_batch_size <= 0 or t.global_batch_size <= 0:
        raise ConfigError("keys 'train.global_batch_size' and 'train.micro_batch_size' must be positive")
    if t.global_batch_size % t.micro_batch_size:
        raise ConfigError(
            f"key 'train.micro_batch_size'={t.micro_batch_size} does not divide train.global_batch_size={t.global_batch_size}"
        )
    if len(t.optimizer.betas) != 2:
        raise ConfigError(f"key 'train.optimizer.betas' needs two values, got {list(t.optimizer.betas)}")
    s = t.schedule
    if s.warmup_steps < 0 or s.total_steps <= 0 or s.warmup_steps > s.total_steps:
        raise ConfigError(
            f"keys 'train.schedule.warmup_steps'={s.warmup_steps} and 'total_steps'={s.total_steps} need 0 <= warmup <= total, total > 0"
        )
    if not 0 <= s.min_lr_ratio <= 1:
        raise ConfigError(f"key 'train.schedule.min_lr_ratio' must lie in [0, 1], got {s.min_lr_ratio}")
    if cfg.checkpoint.keep < 0:
        raise ConfigError(f"key 'checkpoint.keep' must be >= 0 (0 keeps every checkpoint), got {cfg.checkpoint.keep}")
    if cfg.checkpoint.init_from is not None and cfg.checkpoint.load is not None:
        raise ConfigError(
            "keys 'checkpoint.init_from' and 'checkpoint.load' are both set: init_from starts a new run from weights, "
            "load continues a saved one; set one"
        )
    if not 0 <= t.freeze_layers <= m.n_layers:
        raise ConfigError(f"key 'train.freeze_layers'={t.freeze_layers} must lie in [0, model.n_layers={m.n_layers}]")


SPIKE_WATCHABLE = ("loss", "grad_norm")


def schedule_steps(s, tokens_per_step: int) -> tuple[int, int, int]:
    """(warmup, total, decay) steps of ``train.schedule``: token counts win over step counts; ``decay`` is the length
    of a wsd schedule's decay (0 for cosine, which decays from the end of warmup). The trainer's rule too."""
    warmup = s.warmup_steps if s.warmup_tokens is None else math.ceil(s.warmup_tokens / tokens_per_step)
    total = max(s.total_steps if s.total_tokens is None else math.ceil(s.total_tokens / tokens_per_step), warmup, 1)
    if s.kind != "wsd":
        return warmup, total, 0
    return warmup, total, s.decay_steps if s.decay_steps is not None else max(1, round(s.decay_fraction * total))


def _check_stability_and_schedule(cfg) -> None:
    watch = list(cfg.train.spike.watch)
    if not watch or any(name not in SPIKE_WATCHABLE for name in watch):
        raise ConfigError(
            f"key 'train.spike.watch' must be a non-empty list of {', '.join(SPIKE_WATCHABLE)}, got {watch}"
        )
    s = cfg.train.schedule
    warmup, total, decay = schedule_steps(s, cfg.train.global_batch_size * cfg.data.seq_len)
    if warmup + decay > total:
        key = "decay_steps" if s.decay_steps is not None else "decay_fraction"
        raise ConfigError(
            f"key 'train.schedule.{key}'={getattr(s, key)} gives a decay of {decay} steps, which with {warmup} warmup "
            f"steps does not fit in total_steps={total}"
        )


def _check_data_sources(cfg) -> None:
    """data.source or data.sources (a mixture of token folders), exactly one; positive weights; a validation
    source of its own when token folders train and eval.val_every asks for a validation loss."""
    d = cfg.data
    if d.sources and d.source is not None:
        raise ConfigError(
            f"keys 'data.source' and 'data.sources' are both set (data.source={d.source}): use one; set "
            "data.source=null to train on the mixture"
        )
    if not d.sources and d.source is None:
        raise ConfigError("key 'data.source' is null and data.sources is empty: set one of them")
    for k, entry in enumerate(d.sources):
        if not entry.path:
            raise ConfigError(f"key 'data.sources[{k}].path' is empty: give each source a token folder")
        if not (math.isfinite(entry.weight) and entry.weight > 0):
            raise ConfigError(f"key 'data.sources[{k}].weight' must be a finite number > 0, got {entry.weight!r}")
    if d.sources and d.format != "text":
        raise ConfigError(f"key 'data.sources' holds token folders of text; data.format={d.format} is read on the fly")
    if cfg.eval.val_every and not d.validation_source and (d.sources or is_token_folder(d.source)):
        raise ConfigError(
            f"key 'eval.val_every'={cfg.eval.val_every} needs data.validation_source when training on token folders "
            "(they hold one split): ladder-data prepare SOURCE DIR --split validation, then data.validation_source=DIR"
        )
