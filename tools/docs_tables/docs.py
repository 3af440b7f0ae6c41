"""The marked tables in the docs: remade from their data (``--write``), or compared with it (``--check``, what
tests/test_docs.py runs).

In a doc, such a table sits between ``<!-- table NAME: COMMAND -->`` and ``<!-- end table -->``; NAME is an entry of
``manifest.toml``, COMMAND the recipe that writes its data and then ``python -m tools.docs_tables --write``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ladder_train.errors import EXIT_BAD_INPUT, InputError
from ladder_train.files import write_text

from .manifest import DOCS, TABLES, MissingData

PROG = "python -m tools.docs_tables"
COMMAND = f"{PROG} --write"
_BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+): [^\n]*-->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def make_table(name: str, root: Path) -> str:
    """The table ``name`` from its data; a missing data file raises MissingData, an unknown name KeyError."""
    return TABLES[name](root)


def remake(text: str, root: Path, skip_missing: bool = False) -> str:
    """``text`` with every marked table made again from its data; with ``skip_missing`` a table whose data is
    missing keeps its text."""

    def fill(match: re.Match) -> str:
        try:
            return match.group(1) + make_table(match.group("name"), root) + match.group(4)
        except MissingData as err:
            if not skip_missing:
                raise
            print(f"kept: {err}", file=sys.stderr)
            return match.group(0)

    return _BLOCK.sub(fill, text)


def stale_tables(root: Path, docs: tuple[str, ...] = DOCS) -> list[str]:
    """``DOC: NAME`` for every marked table whose text differs from what its data give."""
    stale = []
    for doc in docs:
        text = (root / doc).read_text()
        for match in _BLOCK.finditer(text):
            if match.group("body") != make_table(match.group("name"), root):
                stale.append(f"{doc}: {match.group('name')}")
    return stale


def _missing(name: str, root: Path) -> bool:
    try:
        make_table(name, root)
    except MissingData:
        return True
    return False


HELP = f"""usage: {PROG} (--write | --check) [--root DIR]

  --write     remake every marked table in the docs
  --check     exit 1 if a marked table differs from its data
  --root DIR  the repository (default: here)"""


def parse_command(argv: list[str]) -> tuple[str, Path]:
    """(``write`` or ``check``, the repository) from the command line; anything else is an InputError of one line."""
    actions, root = set(), Path(".")
    args = iter(argv)
    for arg in args:
        if arg in ("--write", "--check"):
            actions.add(arg.removeprefix("--"))
        elif arg == "--root" or arg.startswith("--root="):
            folder = arg.removeprefix("--root=") if "=" in arg else next(args, "")
            if not folder:
                raise InputError("--root needs a folder")
            root = Path(folder)
        else:
            raise InputError(f"unknown argument {arg!r} (see --help)")
    if len(actions) != 1:
        raise InputError("give one of --write and --check")
    return actions.pop(), root


def write_tables(root: Path) -> int:
    """Remake every marked table; one whose data is missing keeps its text, and the exit status (1) says so. Every
    doc is remade before any is written: data that cannot be read (InputError) leaves all of them as they were."""
    missing, remade = [], {}
    for doc in DOCS:
        text = (root / doc).read_text()
        remade[doc] = remake(text, root, skip_missing=True)
        missing += [m.group("name") for m in _BLOCK.finditer(text) if _missing(m.group("name"), root)]
    for doc, text in remade.items():
        write_text(root / doc, text)
    return 1 if missing else 0


def check_tables(root: Path) -> int:
    """0 when every marked table equals what its data give, else 1 with a line per stale table."""
    try:
        stale = stale_tables(root)
    except MissingData as err:
        print(err, file=sys.stderr)
        return 1
    for entry in stale:
        print(f"stale table: {entry} (remake it: {COMMAND})", file=sys.stderr)
    return 1 if stale else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    try:
        action, root = parse_command(argv)
        return write_tables(root) if action == "write" else check_tables(root)
    except InputError as err:  # a data file that cannot be read (a line cut short): named, with its line
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
