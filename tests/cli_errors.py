"""Running a console script in this process the way a user would, and the bad-input contract every script keeps:
exit 2 and one line, ``PROG: error: ...``, naming the culprit (tests/test_cli.py's table and the bad-input tests)."""

from __future__ import annotations

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


def assert_bad_input(prog: str, argv: list[str], named: str, capsys, monkeypatch) -> None:
    """``prog argv`` exits 2 with one line ``PROG: error: ...`` that contains ``named``."""
    status, _, err = run_cli(prog, argv, capsys, monkeypatch)
    assert status == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prog) and ": error: " in lines[0], err
    assert named in lines[0], err
