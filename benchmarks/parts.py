"""A supervisor of the subprocesses a GPU benchmark runs (gpu_check's parts, gpu_study's trainers): each part is a
process group of its own with a time limit, killed whole when the part ends, when its work is in (``done``: it is
stopped rather than waited for) or when its time is up, so no process outlives it; Ctrl-C, and SIGTERM inside
``sigterm_interrupts``, stop every running part the same way. Each part's output goes to its log, whose last error
line says why a part failed (``failure``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # where the parts run
POLL_S = 0.5
STOP = threading.Event()  # set on Ctrl-C / SIGTERM: every running part kills its process group


@dataclass
class Part:
    """One subprocess: ``done`` says its work is in (it is then stopped rather than waited for)."""

    name: str
    kind: str
    argv: list[str]
    limit_s: float
    log: Path
    done: object = None  # () -> bool
    info: dict = field(default_factory=dict)
    outcome: dict = field(default_factory=dict)


def kill_group(proc: subprocess.Popen, gentle: bool) -> None:
    """Every process of the part's group: SIGTERM first when ``gentle`` (a time limit), then SIGKILL."""
    if gentle and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_part(part: Part, env: dict) -> dict:
    """Runs ``part`` to its end, its ``done`` or its limit; its outcome (rc, timed_out, stopped, wall_s)."""
    from ladder_train.files import open_to_write

    if STOP.is_set():
        part.outcome = {"rc": None, "timed_out": False, "stopped": False, "interrupted": True, "wall_s": 0.0}
        return part.outcome
    start = time.monotonic()
    rc, timed_out, stopped = None, False, False
    with open_to_write(part.log, "w") as log:  # never through a link planted in the logs folder
        log.write("$ " + shlex.join(part.argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            part.argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while rc is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = proc.wait(timeout=POLL_S)
                break
            if STOP.is_set():
                break
            if part.done is not None and part.done():
                stopped = True
                break
            if time.monotonic() - start > part.limit_s:
                timed_out = True
                break
    finally:
        kill_group(proc, gentle=timed_out or STOP.is_set())
    part.outcome = {
        "rc": rc,
        "timed_out": timed_out,
        "stopped": stopped,
        "interrupted": rc is None and not (timed_out or stopped),
        "wall_s": round(time.monotonic() - start, 1),
    }
    print(f"  {part.name}: {describe_outcome(part.outcome)} ({part.outcome['wall_s']:.0f} s)", flush=True)
    return part.outcome


def describe_outcome(outcome: dict) -> str:
    if outcome.get("stopped"):
        return "done (stopped after its last step)"
    if outcome.get("timed_out"):
        return "TIMED OUT"
    if outcome.get("interrupted"):
        return "interrupted"
    return "done" if outcome.get("rc") == 0 else f"FAILED (exit {outcome.get('rc')})"


def part_ok(part: Part) -> bool:
    return part.outcome.get("rc") == 0 or bool(part.outcome.get("stopped"))


def run_parts(parts: list[Part], env: dict, jobs: int, start_by: float | None = None) -> None:
    """``jobs`` parts at once; with ``start_by`` (a time.monotonic() deadline) a part not started by then is not
    started (its outcome says ``not_started``)."""
    if not parts:
        return

    def start(part: Part) -> None:
        if start_by is not None and time.monotonic() > start_by:
            part.outcome = {"rc": None, "not_started": True, "wall_s": 0.0}
        else:
            run_part(part, env)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(start, part) for part in parts]
        try:
            for future in futures:
                future.result()
        except BaseException:
            STOP.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def failure(part: Part) -> str | None:
    """Why a part failed: its outcome and the log's last error line (or last line)."""
    if part_ok(part):
        return None
    lines = [x for x in part.log.read_text(errors="replace").splitlines() if x.strip()] if part.log.exists() else []
    errors = [x for x in lines if re.search(r"Error|error:|Killed|Traceback", x)]
    last = (errors or lines or [""])[-1].strip()
    return f"{describe_outcome(part.outcome)}: {last[:300]}"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts():
    """Inside: SIGTERM (an outer time limit, as ``timeout`` sends) raises KeyboardInterrupt like Ctrl-C, so the caller
    stops its parts and keeps what finished."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
