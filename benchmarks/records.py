"""What every developer benchmark's JSON line carries, and the writer that appends them.

A row is one measured quantity of one repeat: the figures and their raw inputs (tokens and seconds, per-step
walls), the invocation it came from (``invocation``: one id per command, ``command``: the command line, ``date`` and
``started`` in UTC), the machine (``host``: CPU model, cores, threads, library versions) and the settings. The docs'
tables are remade from such files by ``python -m tools.docs_tables --write`` (``tools/docs_tables/bench_tables.py``).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import NoReturn

import torch

from ladder_train.bench.results import cpu_model

VERSIONS = ("torch", "tokenizers", "datasets", "torchdata", "numpy")


class BenchmarkError(RuntimeError):
    """A measurement did not do the work it timed."""


def versions(names: tuple[str, ...] = VERSIONS) -> dict[str, str | None]:
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def host() -> dict:
    """The machine a row was measured on."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "hostname": platform.node(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "versions": versions(),
    }


def invocation(module: str, argv: list[str] | None) -> dict:
    """The fields every row of one command shares: its id, command line, date and start time, and the host."""
    started = datetime.datetime.now(datetime.UTC)
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "invocation": f"{started:%Y%m%dT%H%M%S}-{os.getpid()}",
        "command": shlex.join(["python", "-m", module, *args]),
        "date": started.date().isoformat(),
        "started": started.isoformat(timespec="seconds"),
        "host": host(),
    }


def append_rows(path: str | Path | None, rows: list[dict]) -> None:
    """Append ``rows`` to the JSON lines file ``path`` (its folder made if needed); nothing when ``path`` is None."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"appended {len(rows)} rows to {path}")


def refuse(prog: str, message: str) -> NoReturn:
    """Bad input, before any work: one line ``PROG: error: ...`` and exit 2, as the console scripts do."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def pair_ratios(rows: list[dict], field: str = "tokens_per_s", over: str = "b", under: str = "a") -> list[float]:
    """Rows of alternating pairs of rounds (train_ab.py, loss_ab.py): variant ``over``'s ``field`` over variant
    ``under``'s within each pair (an invocation's round)."""
    per = {(r["invocation"], r["round"], r["variant"]): r[field] for r in rows}
    return [per[i, p, over] / per[i, p, under] for (i, p, v) in per if v == under]
