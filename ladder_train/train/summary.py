"""``RUN_DIR/summary.json``, written by rank 0: whether the run reached its last step (``finished``: a study skips a
finished point), the step and tokens it reached, the FSDP gradient accumulation it chose (``MicroBatchPlan.accumulate``:
unsharded, sharded or none) and, once finished, its final loss. It is written as the run starts (what it chose,
readable while it runs), when it finishes, and when it stops before its last step (a signal, a failure): then it
keeps ``"finished": false`` with the step and tokens reached."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ..errors import InputError
from ..files import replace_written, write_text

SUMMARY = "summary.json"


class RunSummary:
    """One run's summary.json; every rank holds one, rank 0 (``is_main``) writes it."""

    def __init__(self, run_dir: Path, fsdp_gradients: str, is_main: bool):
        self.path, self.fsdp_gradients, self.is_main = Path(run_dir) / SUMMARY, fsdp_gradients, is_main
        self.finished = False

    def write(self, step: int, tokens: int, finished: bool = False, **figures) -> None:
        if not self.is_main:
            return
        summary = {"finished": finished, "step": step, "tokens": tokens, **figures}
        summary["fsdp_gradients"] = self.fsdp_gradients
        # whole or not at all: a run stopped as it writes (gpu_check stops runs after their last step) keeps the last
        partial = write_text(self.path.with_name(f"{SUMMARY}.partial"), json.dumps(summary) + "\n")
        replace_written(partial, self.path)
        self.finished = finished

    def stopped(self, step: int, tokens: int) -> None:
        """The run ends here: unless it finished, the summary gives the step and tokens it reached. A write that fails
        as well (the disk that stopped the run is full) is left unsaid: the error that ended the run is the one told."""
        if not self.finished:
            with contextlib.suppress(OSError, InputError):
                self.write(step, tokens)
