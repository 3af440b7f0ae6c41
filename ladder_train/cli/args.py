"""Flag parsing shared by the console scripts: comma-separated lists and ``--set FIELD=VALUE`` model overrides."""

from __future__ import annotations

import dataclasses

from ..errors import InputError
from ..model.transformer import ModelArgs

# ModelArgs fields --set may change, and how their text becomes a value
_SETTABLE = {f.name: f.type for f in dataclasses.fields(ModelArgs) if f.name not in ("rope_scaling",)}


def names(text: str) -> list[str]:
    """``"a,b,,c"`` -> ``["a", "b", "c"]``."""
    return [value for value in text.split(",") if value]


def int_list(flag: str, text: str) -> list[int]:
    """A comma-separated list of positive integers, or an InputError naming the flag."""
    try:
        values = [int(value) for value in names(text)]
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise InputError(f"{flag} must list positive integers, got {text!r}")
    return values


def model_overrides(items: list[str]) -> dict:
    """``["dim=1024", "norm_eps=1e-6", "residual=ladder"]`` -> ModelArgs fields with their types."""
    out: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in _SETTABLE:
            raise InputError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(_SETTABLE)}")
        kind = _SETTABLE[key]
        try:
            if "float" in kind:
                out[key] = float(text)
            elif "int" in kind:
                out[key] = None if text in ("none", "null") and "None" in kind else int(text)
            elif "bool" in kind:
                out[key] = {"true": True, "false": False}[text.lower()]
            else:
                out[key] = text
        except (KeyError, ValueError):
            raise InputError(f"--set {item!r}: {key} takes {kind.replace(' | None', ' or none')}") from None
    return out
