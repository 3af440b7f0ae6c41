"""What every developer benchmark's JSON line carries, the writer that appends them and the reader, and the argument
types the benchmarks share.

A row is one measured quantity of one repeat: the figures and their raw inputs (tokens and seconds, per-step
walls), the invocation it came from (``invocation``: one id per command, ``command``: the command line, ``date`` and
``started`` in UTC), the machine (``host``: CPU model, cores, threads, library versions) and the settings; the
invocation and the machine are the library's environment record (``ladder_train/bench/environment.py``). The docs'
tables are remade from such files by ``python -m tools.docs_tables --write`` (``tools/docs_tables/bench_tables.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import NoReturn


class BenchmarkError(RuntimeError):
    """A measurement did not do the work it timed."""


def invocation(module: str, argv: list[str] | None) -> dict:
    """The fields every row of one command shares: the library's environment record (its id, command line, date
    and start time, and the host)."""
    from ladder_train.bench import environment  # imports torch: gpu_check imports this module before ensure_imports

    args = sys.argv[1:] if argv is None else list(argv)
    return {**environment.invocation(["python", "-m", module, *args]), "host": environment.host()}


def append_rows(path: str | Path | None, rows: list[dict]) -> None:
    """Append ``rows`` to the JSON lines file ``path`` (its folder made if needed); nothing when ``path`` is None."""
    if path is None:
        return
    from ladder_train.files import open_to_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_to_write(path, "a") as f:  # never through a link
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"appended {len(rows)} rows to {path}")


def read_jsonl(path: Path) -> list[dict]:
    """The complete JSON lines of ``path`` (a line being written is left out); [] when there is no file."""
    rows = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
    return rows


def refuse(prog: str, message: str) -> NoReturn:
    """Bad input, before any work: one line ``PROG: error: ...`` and exit 2, as the console scripts do."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def config_override(text: str) -> str:
    if "=" not in text or not text.split("=", 1)[0]:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def pair_ratios(rows: list[dict], field: str = "tokens_per_s", over: str = "b", under: str = "a") -> list[float]:
    """Rows of alternating pairs of rounds (train_ab.py, loss_ab.py): variant ``over``'s ``field`` over variant
    ``under``'s within each pair (an invocation's round)."""
    per = {(r["invocation"], r["round"], r["variant"]): r[field] for r in rows}
    return [per[i, p, over] / per[i, p, under] for (i, p, v) in per if v == under]
