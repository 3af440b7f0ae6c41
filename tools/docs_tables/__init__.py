"""The docs' tables made from the data committed under ``docs/results/``: ``python -m tools.docs_tables --write``
remakes every marked table, ``--check`` fails where one differs from what its data give.

``manifest.toml`` says which table reads which data and which builder makes it; the builders are the modules
``*_tables.py`` here, on the package's generic parts (``ladder_train.report``'s tables and cells, ``ladder_train.study``'s
statistics). ``docs.py`` finds the marked tables in the docs.
"""

from .docs import COMMAND, PROG, check_tables, main, make_table, parse_command, remake, stale_tables, write_tables
from .manifest import DOCS, MANIFEST, TABLES, Entry, MissingData

__all__ = [
    "COMMAND",
    "DOCS",
    "MANIFEST",
    "PROG",
    "TABLES",
    "Entry",
    "MissingData",
    "check_tables",
    "main",
    "make_table",
    "parse_command",
    "remake",
    "stale_tables",
    "write_tables",
]
