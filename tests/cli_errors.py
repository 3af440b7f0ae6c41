"""Running a console script in this process the way a user would, and the bad-input contract every script keeps:
exit 2 and one line, ``PROG: error: ...``, naming the culprit (tests/test_cli.py's table and the bad-input tests)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import torch

import ladder_train.cli as cli

ENTRIES = {
    "ladder-train": cli.main,
    "ladder-bench": cli.ladder_bench,
    "ladder-eval": cli.ladder_eval,
    "ladder-export": cli.ladder_export,
    "ladder-report": cli.ladder_report,
    "ladder-predict": cli.ladder_predict,
    "ladder-generate": cli.ladder_generate,
    "ladder-data": cli.ladder_data,
}


def run_cli(prog: str, argv: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of console script ``prog`` on a machine without a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    capsys.readouterr()
    try:
        status = ENTRIES[prog](argv)
    except SystemExit as exited:  # argparse's usage errors
        status = exited.code
    out, err = capsys.readouterr()
    return status, out, err


def assert_bad_input(prog: str, argv: list[str], named: str | tuple[str, ...], capsys, monkeypatch) -> None:
    """``prog argv`` exits 2 with one line ``PROG: error: ...`` that contains ``named`` (each of them, for a tuple)."""
    status, _, err = run_cli(prog, argv, capsys, monkeypatch)
    assert status == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prog) and ": error: " in lines[0], err
    assert all(part in lines[0] for part in ((named,) if isinstance(named, str) else named)), err


@contextlib.contextmanager
def planted_fifo(path: Path):
    """``path`` replaced by a FIFO for the block; yields a dict whose ``opened`` says afterwards whether anything in
    it opened the FIFO. A thread holds the FIFO's writing end open-pending: a reader that opens it is let through at
    once and reads end of file, so a reader that would wait for ever fails its test instead of hanging it."""
    path = Path(path)
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    writer = threading.Thread(target=lambda: os.close(os.open(path, os.O_WRONLY)), daemon=True)
    writer.start()  # its open returns only once a reader has opened the FIFO
    seen = {"opened": None}
    try:
        yield seen
    finally:
        # a reader's open has already returned the writer's; the writer only waits for the GIL, which join frees.
        # Nobody opened it, the usual case: every test pays this wait
        writer.join(0.1)
        seen["opened"] = not writer.is_alive()
        if writer.is_alive():  # nobody opened it: open the reading end here to let the writer go
            reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(10)
            os.close(reader)


VICTIM = b"someone's file\n"


def someones_folder(tmp_path: Path) -> Path:
    """Someone's folder, with a file in it: what a planted link to a folder points at."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "theirs").write_bytes(VICTIM)
    return elsewhere


def untouched(elsewhere: Path) -> bool:
    """Nothing written into ``someones_folder``, nothing removed from it."""
    return [p.name for p in elsewhere.iterdir()] == ["theirs"] and (elsewhere / "theirs").read_bytes() == VICTIM
