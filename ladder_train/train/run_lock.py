"""The run.dir lock: one trainer per run folder. ``RUN_DIR/run.lock`` names the holder (host, pid, job, start)."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from ..errors import RunFailed

LOCK_FILE = "run.lock"


class RunDirLocked(RunFailed):
    """Another trainer holds run.dir. ``quiet`` on ranks other than 0, so the message is printed once."""

    def __init__(self, message: str, quiet: bool = False):
        super().__init__(message)
        self.quiet = quiet


def lock_run_dir(run_dir: Path):
    """Take ``RUN_DIR/run.lock`` for this process, or raise RunDirLocked naming the holder. A POSIX record
    lock (fcntl.lockf) is released by the kernel when its process dies (a kill -9'd run does not block its
    restart) and, unlike flock, is not inherited by forked data-loader workers that may outlive it.
    Returns the open file; the lock lasts until it is closed."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115 - held open for the whole run
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EAGAIN):  # a filesystem without locks: run unguarded
            print(
                f"warning: cannot lock {path} ({err.strerror}); a second trainer on run.dir would not be stopped",
                file=sys.stderr,
            )
            return handle
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RunDirLocked(
            f"run.dir={run_dir} is in use by another trainer ({holder}); wait for it to end or pick another run.dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    job = os.environ.get("SLURM_JOB_ID")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    handle.write(f"host {socket.gethostname()}, pid {os.getpid()}{f', job {job}' if job else ''}, since {started}\n")
    handle.flush()
    return handle


def lock_run_dir_on_rank0(run_dir: Path, is_main: bool):
    """Rank 0 takes run.dir's lock; every rank learns whether it got it, so all stop together. Returns rank 0's
    open lock file (None elsewhere)."""
    import torch.distributed as dist

    handle, message = None, ""
    if is_main:
        try:
            handle = lock_run_dir(run_dir)
        except RunDirLocked as err:
            message = str(err)
    box = [message]
    dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise RunDirLocked(box[0], quiet=not is_main)
    return handle
