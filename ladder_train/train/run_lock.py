"""The run.dir lock: one trainer per run folder. ``RUN_DIR/run.lock`` names the holder (host, pid, job, start);
the lock itself is folders.lock_folder's."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, RunFailed
from ..folders import FolderLock, LockHeld, lock_folder

LOCK_FILE = "run.lock"


class RunDirLocked(RunFailed):
    """Another trainer holds run.dir. ``quiet`` on ranks other than 0, so the message is printed once."""

    def __init__(self, message: str, quiet: bool = False):
        super().__init__(message)
        self.quiet = quiet


def lock_run_dir(run_dir: Path) -> FolderLock:
    """Take ``RUN_DIR/run.lock`` for this process (folders.lock_folder: released when the process dies, not held
    by forked data-loader workers), or raise RunDirLocked naming the holder; InputError when run.lock is a link.
    The lock lasts until the returned lock is closed."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return lock_folder(run_dir, LOCK_FILE, "trainer on run.dir")
    except LockHeld as err:
        raise RunDirLocked(
            f"run.dir={run_dir} is in use by another trainer ({err.holder}); wait for it to end or pick another run.dir"
        ) from None


def lock_run_dir_on_rank0(run_dir: Path, is_main: bool) -> FolderLock | None:
    """Rank 0 takes run.dir's lock; every rank learns whether it got it, so all stop together (with rank 0's error,
    printed by rank 0 alone). Returns rank 0's lock (None elsewhere)."""
    import torch.distributed as dist

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
