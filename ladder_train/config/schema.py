"""The config's generic machinery, whatever the section: a field's own rule beside it (``choice`` / ``bounded``,
checked by ``check_fields``), what every value must be (``check_leaves``: finite, 64-bit, no control character), the
shape and text of a recipe layer or an override before OmegaConf merges it (``check_layer``, ``check_recipe_text``,
``check_override_text``: OmegaConf's own answer to these is a traceback, a key '?' or a bool made of 2), and
OmegaConf's errors as one line naming the key (``convert_error``). Each refusal is one ``ConfigError`` line naming
the key and the value, the value cut to ``QUOTE_LIMIT`` characters."""

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

from ..errors import ConfigError

# the longest wait in seconds a setting may ask: a loader worker's queue is polled (select.poll) in milliseconds held
# in a C int, 2**31 - 1 ms; the process group's timeout keeps to it too (c10d's store overflows near 2**63 ns)
MAX_WAIT_S = (2**31 - 1) // 1000


# A field's own constraints sit beside it, in its metadata (config/model.py ... config/run.py; the model's in model/transformer.py):
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


def check_fields(cfg) -> None:
    """Every field's own choice or range (``choice`` / ``bounded`` beside the field)."""
    for dotted, rule in field_rules(type(cfg)):
        value = _value(cfg, dotted)
        if CHOICES in rule and value not in rule[CHOICES]:
            raise ConfigError(f"key '{dotted}' must be one of {', '.join(rule[CHOICES])}, got {quote(value)}")
        if CHECK in rule and not rule[CHECK][0](value):
            raise ConfigError(f"key '{dotted}' must be {rule[CHECK][1]}, got {quote(value)}")


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


def check_leaves(cfg) -> None:
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
