"""The constraints on a config that no type can express. A field's own choices or range sit beside the field
(``choice`` / ``bounded`` in config.py); this module checks them, and the rules that span fields: divisibility, one
data source, a schedule that fits. Each refusal is one line naming the key and the value (``ConfigError``), the
value cut to ``QUOTE_LIMIT`` characters.

Before OmegaConf merges a recipe or an override, ``check_layer`` holds its shape to the schema (a section gets a
mapping, a list field a list, a bool field true or false) and ``check_recipe_text`` / ``check_override_text`` its
text (no control character): OmegaConf's own answer to these is a traceback, a key '?' or a bool made of 2."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field

from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from .errors import ConfigError
from .folders import TOKEN_FOLDER_META, is_token_folder, recorded_max_token_id, token_folder_of

# A field's own constraints sit beside it, in its metadata (config.py; the model's in model/transformer.py):
# CHOICES, the values it may take, or CHECK, (test, what the value must be) for a range.
CHOICES, CHECK = "choices", "check"


def choice(default, choices: tuple):
    """A config field restricted to ``choices``."""
    return field(default=default, metadata={CHOICES: tuple(choices)})


def bounded(default, test, must_be: str):
    """A config field whose value must pass ``test``; ``must_be`` words the rule for the error."""
    return field(default=default, metadata={CHECK: (test, must_be)})


def field_rules(cls, prefix: str = "") -> list[tuple[str, dict]]:
    """``(dotted key, metadata)`` of every field of the config dataclass ``cls`` (nested ones included) that
    carries a choice or a range."""
    hints = typing.get_type_hints(cls)
    rules = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            rules += field_rules(kind, f"{prefix}{f.name}.")
        elif CHOICES in f.metadata or CHECK in f.metadata:
            rules.append((prefix + f.name, f.metadata))
    return rules


def _value(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _check_fields(cfg) -> None:
    for dotted, rule in field_rules(type(cfg)):
        value = _value(cfg, dotted)
        if CHOICES in rule and value not in rule[CHOICES]:
            raise ConfigError(f"key '{dotted}' must be one of {', '.join(rule[CHOICES])}, got {quote(value)}")
        if CHECK in rule and not rule[CHECK][0](value):
            raise ConfigError(f"key '{dotted}' must be {rule[CHECK][1]}, got {quote(value)}")


def _check_betas(cfg) -> None:
    betas = list(cfg.train.optimizer.betas)
    if not all(0 <= beta < 1 for beta in betas):
        raise ConfigError(f"key 'train.optimizer.betas' must lie in [0, 1), got {betas}")


def check_values(cfg) -> None:
    """Constraints no type can express: choices, divisibility, positive sizes."""
    _check_fields(cfg)
    _check_leaves(cfg)
    _check_model(cfg.model, cfg.data.seq_len)
    _check_training(cfg)
    _check_betas(cfg)
    _check_stability_and_schedule(cfg)
    _check_data_sources(cfg)
    _check_token_folders(cfg)


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
    for message in m.desync_field_problems(lambda field: f"key 'model.{field}'"):
        raise ConfigError(message)
    every = next(f.default for f in dataclasses.fields(m) if f.name == "desync_reduce_every")
    if m.residual != "desync" and m.desync_reduce_every != every:
        raise ConfigError(
            f"key 'model.desync_reduce_every'={quote(m.desync_reduce_every)}: only a desync model has it (leave it at "
            f"{every} for model.residual={m.residual!r})"
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
    if t.micro_batch_size <= 0 or t.global_batch_size <= 0:
        raise ConfigError("keys 'train.global_batch_size' and 'train.micro_batch_size' must be positive")
    if t.global_batch_size % t.micro_batch_size:
        raise ConfigError(
            f"key 'train.micro_batch_size'={t.micro_batch_size} does not divide train.global_batch_size={t.global_batch_size}"
        )
    if len(t.optimizer.betas) != 2:
        raise ConfigError(f"key 'train.optimizer.betas' needs two values, got {list(t.optimizer.betas)}")
    s = t.schedule
    if s.warmup_steps > s.total_steps:
        raise ConfigError(
            f"keys 'train.schedule.warmup_steps'={s.warmup_steps} and 'total_steps'={s.total_steps} need warmup <= total"
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


def _token_folder_keys(d) -> list[tuple[str, str]]:
    """(key, path) of every place a token folder may be named."""
    keys = [("data.source", d.source), ("data.validation_source", d.validation_source)]
    keys += [(f"data.sources[{k}].path", entry.path) for k, entry in enumerate(d.sources)]
    return [(key, str(path)) for key, path in keys if path]


def _check_token_folders(cfg) -> None:
    """A token folder is named by its folder, not one of its files; a folder whose metadata records ids past
    model.vocab_size is refused now, not by an IndexError in the embedding (the loader checks every window too)."""
    vocab = cfg.model.vocab_size
    for key, path in _token_folder_keys(cfg.data):
        folder = token_folder_of(path)
        if folder is not None:
            raise ConfigError(
                f"key '{key}'={path} is a file of the token folder {folder}: give the folder, {key}={folder}"
            )
        largest = recorded_max_token_id(path)  # None but in a token folder; which reader a source gets is the loader's
        if largest is not None and largest >= vocab:
            raise ConfigError(
                f"key '{key}'={path}: the token folder holds ids up to {largest} ({TOKEN_FOLDER_META} max_token_id), "
                f"outside model.vocab_size={vocab}: train it with the tokenizer it was made with and its vocabulary "
                "size, or prepare it again with this model's tokenizer"
            )


# --- what a refusal quotes, and the shape and text of a layer before OmegaConf merges it -----------------------------

QUOTE_LIMIT = 80  # characters of a value or key a refusal quotes: a whole file read as a recipe is not echoed
INT64 = 2**63  # torch and numpy hold integers in 64 bits: a setting past that overflows where it is used
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode's control characters (category Cc)
CONTROL_IN_YAML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # the same less tab and line breaks


def quote(value, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters (ending '...') when longer."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_override_text(item: str) -> None:
    """A control character in a ``key=value`` override (YAML's reader refuses it with a traceback)."""
    found = CONTROL.search(item)
    if found:
        key = quote(item.partition("=")[0])
        raise ConfigError(f"override {quote(item)}: key {key} holds a control character {found.group()!r}: remove it")


def check_recipe_text(path, text: str) -> None:
    """A control character in a recipe other than tab and line breaks, named by its line and the key there."""
    found = CONTROL_IN_YAML.search(text)
    if found is None:
        return
    number = text.count("\n", 0, found.start()) + 1
    key = re.match(r"\s*(?:-\s*)?([^\s:#][^:#]*?)\s*:", text.splitlines()[number - 1])
    where = f"line {number}" + (f" (key {quote(key.group(1))})" if key else "")
    raise ConfigError(f"{path}: {where}: a control character {found.group()!r}, which YAML does not allow: remove it")


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _unwrap(kind) -> tuple[typing.Any, bool]:
    """(the type, whether None is allowed) of ``X``, ``X | None`` or ``Optional[X]``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(kind) if a is not type(None)]
        return rest[0], len(rest) < len(typing.get_args(kind))
    return kind, False


def _words(kind) -> str:
    """How a refusal names what ``kind`` takes: ``list[str] or null``, ``bool``, a section's mapping."""
    base, optional = _unwrap(kind)
    if dataclasses.is_dataclass(base):
        return "a mapping of the section's keys"
    args = typing.get_args(base)
    name = typing.get_origin(base).__name__ + f"[{', '.join(a.__name__ for a in args)}]" if args else base.__name__
    return name + (" or null" if optional else "")


def _wrong_shape(value, kind) -> bool:
    """Whether ``value`` (a plain container's) cannot be ``kind``: a container of another kind, a container for a
    scalar, anything but true or false for a bool, null where null is not allowed. Interpolations pass."""
    base, optional = _unwrap(kind)
    if value is None:
        return not optional
    if isinstance(value, str) and "${" in value:
        return False
    container = dict if dataclasses.is_dataclass(base) else typing.get_origin(base) or base
    if container in (dict, list):
        return not isinstance(value, container)
    return isinstance(value, (dict, list)) or (base is bool and not isinstance(value, bool))


def check_layer(node: dict, cls, origin: str, prefix: str = "") -> None:
    """Hold one untyped layer (a recipe's or an override's plain container) to the config dataclass ``cls``; unknown
    keys are left to the merge, whose message suggests the near ones."""
    hints = _hints(cls)
    for key, value in node.items():
        if key not in hints:
            continue
        entries = [(f"{prefix}{key}", value, hints[key])]
        base, _ = _unwrap(hints[key])
        if typing.get_origin(base) is list and isinstance(value, list):
            entries += [(f"{prefix}{key}[{i}]", item, typing.get_args(base)[0]) for i, item in enumerate(value)]
        for dotted, item, kind in entries:
            if _wrong_shape(item, kind):
                raise ConfigError(f"{origin}: key '{dotted}' expects {_words(kind)}, got {quote(item)}")
            if dataclasses.is_dataclass(kind) and isinstance(item, dict):
                check_layer(item, kind, origin, dotted + ".")


def leaves(value, key: str = ""):
    """(dotted key, value) of every scalar of a resolved config: sections by field, lists by index, mappings by key."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from leaves(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield from leaves(item, f"{key}.{name}")
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for i, item in enumerate(value):
            yield from leaves(item, f"{key}[{i}]")
    else:
        yield key, value


def _check_leaves(cfg) -> None:
    """What every value must be, whatever its field: a float finite, an integer within 64 bits, text free of control
    characters (from a YAML escape such as "\\x01")."""
    for key, value in leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"key '{key}' must be a finite number, got {value}")
        if isinstance(value, int) and not -INT64 <= value < INT64:
            raise ConfigError(f"key '{key}' must fit in 64 bits (what torch and numpy hold), got {quote(value)}")
        found = CONTROL.search(value) if isinstance(value, str) else None
        if found:
            raise ConfigError(f"key '{key}' holds a control character {found.group()!r}: remove it")


def _section_type(dotted: str, root):
    """The dataclass that holds the key ``dotted`` (its parent), walking from ``root``."""
    current = root
    for part in dotted.split(".")[:-1]:
        fields = {f.name: f for f in dataclasses.fields(current)}
        if part not in fields or not dataclasses.is_dataclass(fields[part].default_factory):
            break
        current = fields[part].default_factory
    return current


def unknown_key_message(dotted: str, origin: str, root) -> str:
    valid = [f.name for f in dataclasses.fields(_section_type(dotted, root))]
    close = difflib.get_close_matches(dotted.split(".")[-1], valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    shown = dotted if len(dotted) <= QUOTE_LIMIT else dotted[: QUOTE_LIMIT - 3] + "..."
    return f"{origin}: unknown key '{shown}'{hint}; valid keys here: {', '.join(valid)}"


def convert_error(err: OmegaConfBaseException, origin: str, root) -> ConfigError:
    """OmegaConf's error for the config dataclass ``root`` as one line naming the key."""
    key = getattr(err, "full_key", None) or getattr(err, "key", None)
    if key and isinstance(err, (ConfigKeyError, ConfigAttributeError)):
        return ConfigError(unknown_key_message(str(key), origin, root))
    if key and isinstance(err, ValidationError):
        leaf = str(key).split(".")[-1]
        types_ = {f.name: f.type for f in dataclasses.fields(_section_type(str(key), root))}
        want = str(types_.get(leaf, "another type")).replace(" | None", " or null")
        return ConfigError(f"{origin}: key '{key}' expects {want}, got {quote(getattr(err, 'value', None))}")
    return ConfigError(f"{origin}: {str(err).splitlines()[0][: 2 * QUOTE_LIMIT]}")
