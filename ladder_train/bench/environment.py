"""The environment record a measurement carries: the invocation (an id no other invocation shares, the command line,
the date and start in UTC) and the machine (CPU model, cores, threads, GPU, Python, library versions).
``ladder-bench``'s rows (``runner.py``) and the repository's benchmarks (benchmarks/records.py, gpu_check) take it
from here, so every row of one file tells its invocation and machine apart the same way."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
from pathlib import Path

import torch

VERSIONS = ("torch", "tokenizers", "datasets", "torchdata", "numpy")


def cpu_model() -> str:
    """The processor's name (``model name`` of /proc/cpuinfo on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def invocation(command: list[str] | None = None, started: datetime.datetime | None = None) -> dict:
    """The fields every row of one invocation shares: ``invocation`` (its start to the microsecond and the process
    id), ``command`` (when given), ``date`` and ``started`` (UTC)."""
    started = started or datetime.datetime.now(datetime.UTC)
    record = {"invocation": invocation_id(started)}
    if command is not None:
        record["command"] = shlex.join(command)
    return record | {"date": started.date().isoformat(), "started": started.isoformat(timespec="seconds")}


def invocation_id(started: datetime.datetime) -> str:
    return f"{started:%Y%m%dT%H%M%S.%f}-{os.getpid()}"
