"""The tables of the docs that are made from data committed under ``docs/results/``.

In a doc, such a table sits between ``<!-- table NAME: COMMAND -->`` and ``<!-- end table -->``;
``python -m ladder_train.report.docs_tables --write`` remakes every one from its data, ``--check`` (what
tests/test_docs.py runs) fails where a doc's table differs from what its data give. NAME picks the function in
``TABLES`` below; the layout study's tables are in ``doc_study_tables.py``, the benchmarks' in
``doc_bench_tables.py`` (benchmarks/*.py ``--out``) and ``doc_tp_tables.py`` (ladder-bench ``--out``, several
invocations per file: medians and ranges).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import EXIT_BAD_INPUT, InputError
from . import doc_bench_tables, doc_eval_tables, doc_gpu_tables, doc_predict_tables, doc_study_tables, doc_tp_tables
from .tables import markdown_table

DOCS = ("README.md", "docs/results.md", "docs/benchmarks.md", "docs/guide.md", "docs/design.md")
COMMAND = "python -m ladder_train.report.docs_tables --write"
_BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+): [^\n]*-->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def json_table(relative: str) -> Callable[[Path], str]:
    """A table stored as ``{"header": [...], "rows": [[...]], "note": "..."}`` by the script that measured it."""

    def make(root: Path) -> str:
        data = json.loads((root / relative).read_text())
        note = f"\n\n{data['note']}\n" if data.get("note") else "\n"
        return markdown_table(data["header"], data["rows"]) + note

    return make


def activation_memory(root: Path) -> str:
    """benchmarks/activation_memory.py's rows: the memory held after forward and the peak of each layout and
    checkpointing mode, each against the layout's mode none, with the loss and the gradients' largest difference."""
    rows = [json.loads(line) for line in (root / ACTIVATION_MEMORY).read_text().splitlines()]
    none = {row["layout"]: row for row in rows if row["mode"] == "none"}
    body = []
    for row in rows:
        base, held, peak = none[row["layout"]], row["held_after_forward_bytes"], row["peak_bytes"]
        body.append(
            [
                row["layout"],
                row["mode"],
                f"{held / 2**20:,.1f}",
                f"{held / base['held_after_forward_bytes']:.2f}",
                f"{peak / 2**20:,.1f}",
                f"{peak / base['peak_bytes']:.2f}",
                f"{row['loss']:.6f}",
                f"{row['max_grad_diff']:g}",
            ]
        )
    header = ["layout", "mode", "held MiB", "/ none", "peak MiB", "/ none", "loss", "max grad diff to none"]
    return markdown_table(header, body) + "\n"


ACTIVATION_MEMORY = "docs/results/activation_memory/cpu.jsonl"  # written by `python -m benchmarks.activation_memory`

TABLES: dict[str, Callable[[Path], str]] = {
    **doc_study_tables.TABLES,  # the layout study's runs under docs/results/study_small/
    "predict-paper70": json_table("docs/results/predict_paper70.json"),  # written by `ladder-predict paper --out`
    "activation-memory": activation_memory,
    **doc_bench_tables.TABLES,  # the developer benchmarks' JSON lines (benchmarks/*.py --out)
    **doc_tp_tables.TABLES,  # ladder-bench's JSON lines, several invocations per file
    **doc_eval_tables.TABLES,  # ladder-eval's results JSON
    **doc_gpu_tables.TABLES,  # benchmarks/gpu_check.py's rows of one card and date
    **doc_predict_tables.TABLES,  # ladder-predict's JSON lines and benchmarks/predictor_sensitivity.py's
}


class MissingData(Exception):
    """A marked table whose data file is not there (yet): one line naming the table and the file."""


def make_table(name: str, root: Path) -> str:
    """The table ``name`` from its data; a missing data file raises MissingData, an unknown name KeyError."""
    try:
        return TABLES[name](root)
    except FileNotFoundError as err:
        raise MissingData(f"table {name}: {err.filename} not found (run the command beside the table)") from None


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


PROG = "python -m ladder_train.report.docs_tables"
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
    """Remake every marked table; one whose data is missing keeps its text, and the exit status (1) says so."""
    missing = []
    for doc in DOCS:
        path = root / doc
        text = path.read_text()
        path.write_text(remake(text, root, skip_missing=True))
        missing += [m.group("name") for m in _BLOCK.finditer(text) if _missing(m.group("name"), root)]
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
    except InputError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return write_tables(root) if action == "write" else check_tables(root)


if __name__ == "__main__":
    sys.exit(main())
