"""The one folder lock (:func:`lock_folder`), for a run folder's trainer and ``ladder-data prepare``'s OUT_DIR: a
POSIX record lock on a file in the folder, which names its holder, and is never opened through a link."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from .files import open_no_follow

# -- the folder lock --------------------------------------------------------------------------------------------

_LOCK_BUSY = (errno.EAGAIN, errno.EACCES)
_HELD: dict[tuple[int, int], str] = {}  # this process's lock files: (device, inode) -> the holder line written


class LockHeld(Exception):
    """Another process (or this one) holds a folder's lock; ``holder`` is the line it wrote."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder}")
        self.path, self.holder = path, holder


class FolderLock:
    """A folder lock this process holds (:func:`lock_folder`); ``close()`` releases it."""

    def __init__(self, path: Path, handle, key: tuple[int, int]):
        self.path, self._handle, self._key = path, handle, key

    def close(self, remove: bool = False) -> None:
        """Release the lock; ``remove`` deletes the file first, while still held, so that a process which opened it
        meanwhile finds it gone and takes a new one."""
        if self._handle.closed:
            return
        if remove and _same_file(self._handle, self.path):
            self.path.unlink(missing_ok=True)
        _HELD.pop(self._key, None)
        self._handle.close()


def lock_folder(folder: Path, name: str, user: str) -> FolderLock:
    """Take the lock ``folder/name`` for this process and write the holder's line into it (host, pid, Slurm job,
    start), or raise LockHeld with the holder's line. A POSIX record lock (fcntl.lockf): the kernel drops it when
    its process dies (a kill -9'd holder blocks nothing) and, unlike flock, forked workers (data loaders, prepare's
    pool) do not inherit it, so none that outlives its parent keeps the folder. lockf would grant this process a
    second lock on the file and drop both when either closes: a second lock here is refused too. The file is never
    opened through a link (InputError naming it). Where the file system has no locks a warning names ``user``
    (e.g. "trainer on run.dir") and the work goes on unguarded."""
    path = Path(folder) / name
    for _ in range(5):  # a holder may remove the file just as this opens it (close(remove=True)): then take the new one
        _refuse_if_held_here(path)
        handle = _open_lock_file(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in _LOCK_BUSY:
                holder = _holder_line(handle)
                handle.close()
                raise LockHeld(path, holder) from None
            print(
                f"warning: cannot lock {path} ({err.strerror}); a second {user} would not be stopped", file=sys.stderr
            )
        if _same_file(handle, path):
            break
        handle.close()
    else:
        raise LockHeld(path, f"unknown: {name} keeps being replaced")
    job = os.environ.get("SLURM_JOB_ID")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    line = f"host {socket.gethostname()}, pid {os.getpid()}{f', job {job}' if job else ''}, since {started}"
    handle.seek(0)
    handle.truncate()
    handle.write(line + "\n")
    handle.flush()
    info = os.fstat(handle.fileno())
    _HELD[(info.st_dev, info.st_ino)] = line
    return FolderLock(path, handle, (info.st_dev, info.st_ino))


def lock_holder(folder: Path, name: str) -> str | None:
    """Who holds the lock ``folder/name`` (the line its holder wrote), or None when nobody does; takes nothing."""
    path = Path(folder) / name
    if (line := _held_here(path)) is not None:
        return line  # not opened: closing any file of it would drop this process's lock
    try:
        handle = _open_lock_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.lockf(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in _LOCK_BUSY:
                return _holder_line(handle)
        return None


def _open_lock_file(path: Path, flags: int):
    """The lock file, opened without following a link (and without blocking on a FIFO); InputError naming the path
    when it is a link (writing the holder's line would overwrite the file it points at) or no plain file."""
    fd = open_no_follow(path, flags, "a lock file")
    return open(fd, "r+" if flags & os.O_RDWR else "r", errors="replace")  # noqa: SIM115 - the caller closes it


def _holder_line(handle) -> str:
    handle.seek(0)
    return handle.readline(500).strip() or "unknown"


def _held_here(path: Path) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return _HELD.get((info.st_dev, info.st_ino))


def _refuse_if_held_here(path: Path) -> None:
    if (line := _held_here(path)) is not None:
        raise LockHeld(path, line)


def _same_file(handle, path: Path) -> bool:
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)
