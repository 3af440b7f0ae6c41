"""The points of a study: a grid over config keys, written as Hydra's multirun writes it.

``key=a,b,c`` sweeps the key over three values; ``key=[a,b]`` is one value (a list); ``key=v`` is fixed. The grid
is the product of the sweeps, the first key outermost. Each point is a run folder inside the study's folder
(``run.dir`` of the recipe and the fixed overrides), named by the command's overrides in the order given, e.g.
``model.residual=ladder,train.optimizer.lr=4e-3,run.seed=0``: two study commands with different fixed values
(each layout at its own rate) may share one study folder without their runs colliding.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError

# keys the study sets for each point itself
_STUDY_KEYS = ("run.dir", "run.name")


@dataclass(frozen=True)
class Point:
    """One run of a study: its position in the grid and its overrides (``key=value`` items)."""

    index: int
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return ",".join(item.replace("/", "_") for item in self.overrides)

    def run_dir(self, study_dir: Path) -> Path:
        return study_dir / self.name

    def run_overrides(self, study_dir: Path) -> list[str]:
        """Everything the trainer is given for this point, on top of the recipe."""
        return [*self.overrides, f"run.dir={self.run_dir(study_dir)}", f"run.name={study_dir.name}/{self.name}"]


def split_values(item: str) -> tuple[str, list[str]]:
    """``"k=a,[b,c],d"`` -> ``("k", ["a", "[b,c]", "d"])``: commas outside brackets and quotes separate values."""
    if "=" not in item:
        raise ConfigError(f"study override {item!r} is not of the form key=value or key=a,b,c")
    key, text = item.split("=", 1)
    values, current, depth, quote = [], "", 0, None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(current)
            current = ""
            continue
        current += char
    values.append(current)
    if depth or quote or any(value == "" for value in values):
        raise ConfigError(f"study override {item!r}: unbalanced brackets or quotes, or an empty value in the list")
    return key, values


def grid(overrides: list[str]) -> list[Point]:
    """The study's points, first key outermost. A key may appear once; run.name is the study's to set."""
    axes: list[tuple[str, list[str]]] = []
    for item in overrides:
        key, values = split_values(item)
        if key in (k for k, _ in axes):
            raise ConfigError(f"study override {item!r}: key '{key}' is given twice")
        if key == "run.name":
            raise ConfigError("study: run.name is set per point (the folder's name); name the study with run.dir")
        if key == "run.dir" and len(values) > 1:
            raise ConfigError("study: run.dir names the study's one folder; it cannot be swept")
        axes.append((key, values))
    axes = [(key, values) for key, values in axes if key not in _STUDY_KEYS]
    combos = itertools.product(*([f"{key}={value}" for value in values] for key, values in axes))
    return [Point(index, tuple(combo)) for index, combo in enumerate(combos)]


def fixed_overrides(overrides: list[str]) -> list[str]:
    """The overrides that name the study itself (run.dir): they apply to every point and to no folder name."""
    return [item for item in overrides if item.split("=", 1)[0] in _STUDY_KEYS]
