"""``manifest.toml`` read: each marked table's builder and data, and the table made from them.

A table is made by calling its builder with what the manifest names: ``builder(rows, FILE, **args)`` for an entry
with ``rows = FILE`` (the file's JSON lines), ``builder(root, **data, **args)`` for one with ``data``. A data file
or folder that is not there makes ``MissingData``, one line naming the table and the path.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ladder_train.bench_schema import read_bench
from ladder_train.errors import InputError

MANIFEST_FILE = Path(__file__).with_name("manifest.toml")


class MissingData(Exception):
    """A marked table whose data file is not there (yet): one line naming the table and the file."""


def read_rows(path: Path) -> list[dict]:
    """The JSON lines of ``path`` (blank lines skipped); a line that is not JSON (one cut short, say) is an InputError
    of one line naming the file and the line."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{number}: not a JSON line ({err.msg})") from None
    return rows


def read_json(path: Path):
    """The JSON document of ``path``; one that is not JSON is an InputError of one line naming the file and where."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: not JSON ({err.msg})") from None


READERS: dict[str, Callable[[Path], list[dict]]] = {"json-lines": read_rows, "ladder-bench": read_bench}


@dataclass(frozen=True)
class Entry:
    """One table of the manifest: its builder (``MODULE:FUNCTION`` in this package) and what it reads."""

    name: str
    builder: str
    rows: str | None = None
    reader: str = "json-lines"
    data: dict[str, str | list[str]] = field(default_factory=dict)
    args: dict = field(default_factory=dict)
    written_by: str = ""

    def function(self) -> Callable[..., str]:
        module, name = self.builder.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)

    def make(self, root: Path) -> str:
        """The table from its data under ``root``; a data file that is not there raises MissingData."""
        paths = [self.rows] if self.rows is not None else [p for v in self.data.values() for p in _as_list(v)]
        key = (repr(self), _contents(root, paths))
        if key not in _MADE:
            try:
                if self.rows is not None:
                    table = self.function()(READERS[self.reader](root / self.rows), self.rows, **self.args)
                else:
                    table = self.function()(root, **self.data, **self.args)
            except FileNotFoundError as err:
                raise MissingData(
                    f"table {self.name}: {err.filename} not found (run the command beside the table)"
                ) from None
            _MADE[key] = table
        return _MADE[key]


# a table is made from its data alone: made once per contents of its files in a process (a --check then --write, or
# the tests' copies of the docs, make each table once), made again when a file changes
_MADE: dict[tuple, str] = {}


def _as_list(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]


def _contents(root: Path, paths: list[str]) -> tuple:
    """(path, sha1 of the bytes) of every file at or under the data paths; a path that is not there, as None."""
    found = []
    for path in paths:
        at = root / path
        files = sorted(f for f in at.rglob("*") if f.is_file()) if at.is_dir() else [at] if at.is_file() else []
        found += [(f.relative_to(root).as_posix(), hashlib.sha1(f.read_bytes()).hexdigest()) for f in files]
        found += [] if files else [(path, None)]
    return tuple(found)


def load(path: Path = MANIFEST_FILE) -> tuple[tuple[str, ...], dict[str, Entry]]:
    """The docs the manifest names and its tables by name; an entry with a key Entry does not know is a TypeError."""
    manifest = tomllib.loads(path.read_text())
    entries = {name: Entry(name=name, **entry) for name, entry in manifest["tables"].items()}
    for entry in entries.values():
        if (entry.rows is None) == (not entry.data) or entry.reader not in READERS:
            raise ValueError(f"{path}: table {entry.name}: give rows or data (and a known reader)")
    return tuple(manifest["docs"]), entries


DOCS, MANIFEST = load()
TABLES: dict[str, Callable[[Path], str]] = {name: entry.make for name, entry in MANIFEST.items()}
