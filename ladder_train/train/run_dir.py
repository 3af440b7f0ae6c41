"""The run folder's own files: the one trainer that may use it (``RUN_DIR/run.lock``, rank 0's, taken before anything
is read or written) and ``RUN_DIR/summary.json``.

``summary.json``, written by rank 0: whether the run reached its last step (``finished``: a study skips a finished
point), the step and tokens it reached, the FSDP gradient accumulation it chose (``MicroBatchPlan.accumulate``:
unsharded, sharded or none) and, once finished, its final loss. It is written as the run starts (what it chose,
readable while it runs), when it finishes, and when it stops before its last step (a signal, a failure): then it
keeps ``"finished": false`` with the step and tokens reached."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch.distributed as dist

from ..errors import InputError, RunFailed
from ..files import refuse_link, replace_written, write_text
from ..folder_lock import FolderLock, LockHeld, lock_folder
from ..folders import refuse_step_links
from .evaluator import EXPORTS, RESULTS
from .stability import SKIP_FILE

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


LOCK_FILE = "run.lock"  # in RUN_DIR: names the trainer that holds it (host, pid, job, start)
RUN_FILES = ("config.yaml", "metrics.jsonl", SUMMARY, f"{SUMMARY}.partial", SKIP_FILE)  # what it writes in RUN_DIR
# the folders wandb and TensorBoard make in RUN_DIR: they follow links, so a link there is refused before they start
LIBRARY_FOLDERS = ("wandb", "tensorboard")


class RunDirLocked(RunFailed):
    """Another trainer holds run.dir. ``quiet`` on ranks other than 0, so the message is printed once."""

    def __init__(self, message: str, quiet: bool = False):
        super().__init__(message)
        self.quiet = quiet


def lock_run_dir(run_dir: Path) -> FolderLock:
    """Take ``RUN_DIR/run.lock`` for this process (folder_lock.lock_folder: released when the process dies, not held
    by data-loader workers), or raise RunDirLocked naming the holder; InputError when run.lock, a file the trainer
    writes (RUN_FILES), a folder wandb or TensorBoard makes (LIBRARY_FOLDERS), an export's folder (RUN_DIR/export,
    its step-N) or the eval results' folder is a link. The lock lasts until the returned lock is closed: one
    trainer per run folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:  # refused before any work; each is written through files.py's rule too
        refuse_link(run_dir / name, "a run folder's file")
    for name in LIBRARY_FOLDERS:
        refuse_link(run_dir / name, "a run folder's wandb or TensorBoard folder")
    refuse_step_links(run_dir / EXPORTS, "a run's export")  # eval.mode=slurm's RUN_DIR/export/step-N
    refuse_link(run_dir / RESULTS, "a run's eval folder")
    try:
        return lock_folder(run_dir, LOCK_FILE, "trainer on run.dir")
    except LockHeld as err:
        raise RunDirLocked(
            f"run.dir={run_dir} is in use by another trainer ({err.holder}); wait for it to end or pick another run.dir"
        ) from None


def lock_run_dir_on_rank0(run_dir: Path, is_main: bool) -> FolderLock | None:
    """Rank 0 takes run.dir's lock; every rank learns whether it got it, so all stop together (with rank 0's error,
    printed by rank 0 alone). Returns rank 0's lock (None elsewhere)."""
    lock, refusal = None, None
    if is_main:
        try:
            lock = lock_run_dir(run_dir)
        except (RunDirLocked, InputError) as err:
            refusal = (isinstance(err, InputError), str(err))
    box = [refusal]
    dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        return lock
    bad_input, message = box[0]
    error = InputError(message) if bad_input else RunDirLocked(message)
    error.quiet = not is_main  # run_command prints a refusal once, from rank 0
    raise error
