"""Flag parsing shared by the console scripts: comma-separated lists and ``--set FIELD=VALUE`` model overrides."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

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


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, ``PROG: error: ...``, exit 2, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(kind, low, inclusive: bool, words: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}")
        return value

    return parse


positive_int = _number(int, 1, True, "an integer >= 1")
non_negative_int = _number(int, 0, True, "an integer >= 0")
non_negative_float = _number(float, 0.0, True, "a finite number >= 0")
positive_float = _number(float, 0.0, False, "a finite number > 0")


def utf8_text(text: str) -> str:
    """Text from the command line that is valid UTF-8 (undecodable bytes arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("is not valid UTF-8 text") from None
    return text


def new_output_folder(text: str) -> Path:
    """An output folder: it may exist as a folder, not as a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} exists and is not a folder")
    return path
