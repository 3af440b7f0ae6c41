"""Starting the package's commands in their own processes, as a user would (the tests that do are marked slow):
the offline environment, one thread, a session of their own, and nothing left running afterwards. The ``launch``
fixture (conftest.py) starts them for a test and ends each one's session at teardown; ``run`` runs one to its end.
Beside them, the /proc reading the lifetime tests assert with (what runs under a process, what outlived it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")
# no network, no wandb, one thread per process (the machine's cores are shared by the tests' processes)
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
# a model and batch small enough for a training step in milliseconds (the benchmarks' tests)
TINY_TRAINING = [
    "model.vocab_size=64",
    "model.dim=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.ffn_dim=64",
    "model.max_seq_len=16",
    "data.seq_len=16",
    "train.global_batch_size=2",
    "train.micro_batch_size=2",
]


def smoke_training(run_dir: Path, *overrides: str) -> list[str]:
    """The arguments of ``python -m ladder_train.train --config recipes/smoke.yaml run.dir=RUN_DIR OVERRIDES``."""
    return ["-m", "ladder_train.train", "--config", SMOKE, f"run.dir={run_dir}", *overrides]


def start(*args, env: dict | None = None, cwd=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
    """``python ARGS`` (``-m MODULE ...``, ``-c CODE``, ``SCRIPT.py ...``), or the console command ARGS[0] of
    this environment (``ladder-train ...``), with the offline environment and ``env`` on top of this process's, in a
    session of its own (so ``end`` finds all it started), its output as text."""
    command = [str(a) for a in args]
    console = Path(sys.executable).parent / command[0]  # a console command, installed beside this python
    if "/" not in command[0] and console.is_file():
        command[0] = str(console)
    else:
        command.insert(0, sys.executable)
    return subprocess.Popen(
        command,
        env={**os.environ, **OFFLINE, **(env or {})},
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def end(proc: subprocess.Popen) -> None:
    """``proc`` and every process of its session killed (the orphans of a run a test stopped or that failed: a
    loader worker, a rank, the fork server), ``proc`` reaped and its pipes closed."""
    if proc.poll() is None:
        proc.kill()
    for pid in in_session(proc.pid):  # its pid is not reused while the session has a process
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def run(*args, timeout: float = 300, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """``start(*args)`` run to its end (at most ``timeout`` s), its output captured, its session ended."""
    proc = start(*args, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        end(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_from_repo(cwd, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``run(*args)`` in folder ``cwd`` with the repository on the path (benchmarks/ and tools/ are not
    installed)."""
    return run(*args, timeout=timeout, cwd=cwd, env={"PYTHONPATH": str(REPO)})


def wait_until(proc: subprocess.Popen, ready, what: str, seconds: float = 300) -> None:
    """Wait for ``ready()`` while ``proc`` runs; an AssertionError naming ``what`` if it ends first or time runs
    out."""
    deadline = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended first (exit {proc.returncode}){_output(proc)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.05)


def _output(proc: subprocess.Popen) -> str:
    try:
        out, err = proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):  # a process under it holds the pipe open, or it was read
        return ""
    return "".join(f"\n{text[-3000:]}" for text in (out, err) if text)


def wait_for_metrics(proc: subprocess.Popen, run_dir: Path, lines: int, seconds: float = 300) -> None:
    """Wait until the run's metrics.jsonl has ``lines`` lines (with train.log_every=1: that many steps logged)."""
    metrics = Path(run_dir) / "metrics.jsonl"
    ready = lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= lines  # noqa: E731
    wait_until(proc, ready, f"training did not start: {lines} lines of {metrics}", seconds)


# processes, read from Linux /proc ------------------------------------------------------------------------------


def running(pid: int) -> bool:
    """Alive and not a zombie (a dead orphan may wait for a reaper that never comes in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``."""
    found, todo = set(), [pid]
    while todo:
        try:
            under = children(todo.pop())
        except (FileNotFoundError, ProcessLookupError):
            continue
        found |= under
        todo += under
    return found


def in_session(sid: int) -> set[int]:
    """Every process of session ``sid``, wherever it hangs now (an orphan's parent is init)."""
    found = set()
    for proc in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                found.add(int(proc.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return found


def survivors(pids, seconds: float) -> list[int]:
    """The processes of ``pids`` still running after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if running(p)]
