"""The points of a study: a grid over config keys, written as Hydra's multirun writes it.

``key=a,b,c`` sweeps the key over three values; ``key=[a,b]`` is one value (a list); ``key=v`` is fixed. The grid
is the product of the sweeps, the first key outermost. Each point is a run folder inside the study's folder
(``run.dir`` of the recipe and the fixed overrides), named by the command's overrides in the order given, e.g.
``model.residual=ladder,train.optimizer.lr=4e-3,run.seed=0``: two study commands with different fixed values
(each layout at its own rate) may share one study folder without their runs colliding. Where that text cannot be a
folder name as it is (a ``/`` or control character, more than 255 bytes), the name is a readable version of it (those
characters as ``_``, cut to fit) plus ``~`` and a hash of the exact overrides, e.g. ``data.source=a_b~a3ff6f5b``:
studies resume by folder name, so a name never depends on anything but the point's own overrides.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError

# keys the study sets for each point itself
_STUDY_KEYS = ("run.dir", "run.name")
NAME_BYTES = 255  # the longest file name most file systems allow
# what cannot stand in a folder name as written: the path separator, control characters (a newline in a name breaks
# every listing), and lone surrogates (bytes of the command line that are not UTF-8)
_UNUSABLE = re.compile(r"[/\x00-\x1f\x7f\ud800-\udfff]")
_HASH_CHARS = 8


def folder_name(overrides: tuple[str, ...]) -> str:
    """The overrides joined by commas when that is a usable folder name; otherwise the same text with unusable
    characters as ``_``, cut to fit, plus ``~`` and a hash of the exact overrides, so that two points whose readable
    text came out the same still get their own folders."""
    exact = ",".join(overrides)
    readable = _UNUSABLE.sub("_", exact)
    if readable == exact and len(exact.encode()) <= NAME_BYTES:
        return exact
    # NUL cannot occur in a command-line argument, so the joined text tells the overrides apart
    digest = hashlib.sha256("\0".join(overrides).encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    suffix = f"~{digest}"
    # "ignore" drops a character cut in half by the byte limit
    shortened = readable.encode()[: NAME_BYTES - len(suffix)].decode("utf-8", "ignore")
    return shortened + suffix


@dataclass(frozen=True)
class Point:
    """One run of a study: its position in the grid and its overrides (``key=value`` items)."""

    index: int
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        """The point's folder inside the study's (``folder_name``)."""
        return folder_name(self.overrides)

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
    points = [Point(index, tuple(combo)) for index, combo in enumerate(combos)]
    _refuse_shared_folders(points)
    return points


def _refuse_shared_folders(points: list[Point]) -> None:
    """A second point in a folder would find the first one's run and skip or resume it as its own."""
    by_name: dict[str, Point] = {}
    for point in points:
        first = by_name.setdefault(point.name, point)
        if first is not point:
            raise ConfigError(
                f"study: points {first.index} and {point.index} would share the folder {point.name!r}: "
                "give each point its own values"
            )


def fixed_overrides(overrides: list[str]) -> list[str]:
    """The overrides that name the study itself (run.dir): they apply to every point and to no folder name."""
    return [item for item in overrides if item.split("=", 1)[0] in _STUDY_KEYS]
