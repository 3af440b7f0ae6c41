"""Every check of a built config, in one place: each field's own rule and what every value must be
(``schema``), each section's rules among its own fields (beside its dataclasses), then the rules that span sections,
here: a sequence that fits the model, frozen layers the model has, a schedule that fits its steps, a validation
source where token folders train, a token folder's ids within the vocabulary."""

from __future__ import annotations

from ..errors import ConfigError
from ..folders import TOKEN_FOLDER_META, is_token_folder, recorded_max_token_id
from .data import check_data, token_folder_keys
from .model import check_model
from .run import check_checkpoint
from .schema import check_fields, check_leaves
from .train import check_train, schedule_steps


def check_values(cfg) -> None:
    """Constraints no type can express: choices and ranges, divisibility, positive sizes, the rules across
    sections. Each refusal is one ConfigError line naming the key."""
    check_fields(cfg)
    check_leaves(cfg)
    check_model(cfg.model)
    check_train(cfg.train)
    check_checkpoint(cfg.checkpoint)
    check_data(cfg.data)
    _check_model_fits(cfg)
    _check_schedule_fits(cfg)
    _check_validation_source(cfg)
    _check_token_folder_vocab(cfg)


def _check_model_fits(cfg) -> None:
    m = cfg.model
    if cfg.data.seq_len > m.max_seq_len:
        raise ConfigError(f"key 'data.seq_len'={cfg.data.seq_len} exceeds model.max_seq_len={m.max_seq_len}")
    if not 0 <= cfg.train.freeze_layers <= m.n_layers:
        raise ConfigError(
            f"key 'train.freeze_layers'={cfg.train.freeze_layers} must lie in [0, model.n_layers={m.n_layers}]"
        )


def _check_schedule_fits(cfg) -> None:
    s = cfg.train.schedule
    warmup, total, decay = schedule_steps(s, cfg.train.global_batch_size * cfg.data.seq_len)
    if warmup + decay > total:
        key = "decay_steps" if s.decay_steps is not None else "decay_fraction"
        raise ConfigError(
            f"key 'train.schedule.{key}'={getattr(s, key)} gives a decay of {decay} steps, which with {warmup} warmup "
            f"steps does not fit in total_steps={total}"
        )


def _check_validation_source(cfg) -> None:
    """A validation source of its own when token folders train and eval.val_every asks for a validation loss."""
    d = cfg.data
    if cfg.eval.val_every and not d.validation_source and (d.sources or is_token_folder(d.source)):
        raise ConfigError(
            f"key 'eval.val_every'={cfg.eval.val_every} needs data.validation_source when training on token folders "
            "(they hold one split): ladder-data prepare SOURCE DIR --split validation, then data.validation_source=DIR"
        )


def _check_token_folder_vocab(cfg) -> None:
    """A folder whose metadata records ids past model.vocab_size is refused now, not by an IndexError in the
    embedding (the loader checks every window too)."""
    vocab = cfg.model.vocab_size
    for key, path in token_folder_keys(cfg.data):
        largest = recorded_max_token_id(path)  # None but in a token folder; which reader a source gets is the loader's
        if largest is not None and largest >= vocab:
            raise ConfigError(
                f"key '{key}'={path}: the token folder holds ids up to {largest} ({TOKEN_FOLDER_META} max_token_id), "
                f"outside model.vocab_size={vocab}: train it with the tokenizer it was made with and its vocabulary "
                "size, or prepare it again with this model's tokenizer"
            )
