"""What a folder is, by its files: the one owner of folder kinds (export, checkpoint, token folder), the file names
that decide them, a run's complete checkpoints (its ``step-N`` folders with the marker) and the run a checkpoint belongs
to, and a folder's optional JSON files. Reads file names and small JSON files only; never weights, never code.

And the one check every reader of a checkpoint or model folder makes before it opens a file (:func:`is_plain_file`):
a regular file, told from its metadata alone, so that a FIFO, socket or device put where a file belongs is refused
in one line instead of blocking or acting when opened.

And the one folder lock (:func:`lock_folder`), for a run folder's trainer and ``ladder-data prepare``'s OUT_DIR: a
POSIX record lock on a file in the folder, which names its holder, and is never opened through a link.

And the one rule for every file the project writes into a folder it does not own alone (a run folder, OUT_DIR, a
study's --collect DEST, a checkpoint, an export): nothing is written, removed or renamed through a symbolic link.
A file is opened with ``O_NOFOLLOW`` (:func:`open_to_write`, :func:`write_text`, :func:`copy_to`), a folder the
project makes inside such a folder is no link (:func:`make_folder`), and only an entry that is what the project
writes is removed or replaced (:func:`remove_written`, :func:`remove_written_tree`, :func:`replace_written`); a link
there is refused in one line naming it (InputError), and what it points at is untouched. The folder a user names
(run.dir, OUT_DIR, DEST, an export's OUT, a run's ``checkpoints/`` put on another disk) may itself be a link."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import sys
import time
from pathlib import Path

from .errors import InputError

CONFIG_JSON = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # a sharded folder: weight_map of tensor name -> shard file
COMPLETE_MARKER = "COMPLETE"  # written last into a checkpoint folder: without it the checkpoint is incomplete
DCP_METADATA = ".metadata"
TOKEN_FOLDER_META = "ladder_tokens.json"  # written last by ladder-data prepare
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
FOLDER_KINDS = ("export", "checkpoint", "incomplete checkpoint")
_STEP_DIR = re.compile(r"^step-(\d+)$")  # a training checkpoint of step N in RUN_DIR/checkpoints/
CHECKPOINT_KINDS = ("checkpoint", "incomplete checkpoint")


def folder_kind(path: str | Path) -> str | None:
    """What a model folder is, by its files alone (nothing is read): ``"export"`` (a Hugging Face Llama folder:
    config.json + model.safetensors or its shard index, what ladder-export writes or a pretrained Llama),
    ``"checkpoint"`` (a complete training checkpoint: the COMPLETE marker), ``"incomplete checkpoint"`` (DCP files
    without the marker), or None."""
    path = Path(path)
    if is_plain_file(path / CONFIG_JSON) and (is_plain_file(path / WEIGHTS_FILE) or is_plain_file(path / INDEX_FILE)):
        return "export"
    if is_plain_file(path / COMPLETE_MARKER):
        return "checkpoint"
    if is_plain_file(path / DCP_METADATA):
        return "incomplete checkpoint"
    return None


# what a name in a folder may be instead of a regular file, as os.stat's mode tells it
_NOT_PLAIN = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def is_file_name(name) -> bool:
    """Whether ``name``, as a file (a manifest, a DCP ``.metadata`` or a shard index) lists another, names a file
    inside the lister's own folder: no separator, no ``..``, no NUL."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def is_plain_file(path: str | Path) -> bool:
    """Whether a regular file is at ``path``, as ``Path.is_file`` says (False when nothing is there, a dangling link
    included), but anything else there raises InputError, one line naming the path and what it is: a FIFO, a socket,
    a device or a directory. Told from ``os.stat`` alone: nothing is opened, so a FIFO cannot block the reader for
    ever nor a device act. A link is followed and judged by what it points at, wherever that is (a Hugging Face
    cache's snapshot folder links every file into its ``blobs/``). Every reader of a checkpoint or model folder asks
    this before it opens a file."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the name
        return False
    except OSError as err:
        if err.errno == errno.ELOOP:  # a circle of links
            return False
        raise
    if stat.S_ISREG(mode):
        return True
    what = next((name for test, name in _NOT_PLAIN if test(mode)), "not a regular file")
    through = " (through a symbolic link)" if path.is_symlink() else ""
    raise InputError(f"{path}: {what}{through}, where a regular file belongs; refused without opening it")


def is_token_folder(source) -> bool:
    """Whether ``source`` is a token folder (``ladder-data prepare``'s output): it holds the metadata file."""
    return source is not None and Path(str(source)).expanduser().joinpath(TOKEN_FOLDER_META).is_file()


def token_folder_of(path) -> Path | None:
    """The token folder ``path`` is a file of (``FOLDER/tokens.bin`` given where ``FOLDER`` is meant), else None."""
    path = Path(str(path)).expanduser()
    return path.parent if path.is_file() and is_token_folder(path.parent) else None


def recorded_max_token_id(folder) -> int | None:
    """The largest token id a token folder's metadata records (ladder-data prepare writes it); None when it
    records none (a folder made before it was recorded) or is no token folder. Not checked against the tokens."""
    meta = read_optional_json(Path(str(folder)).expanduser() / TOKEN_FOLDER_META)
    value = meta.get("max_token_id") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def step_number(path: str | Path) -> int | None:
    """N of a ``step-N`` folder, else None."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def complete_checkpoints(folder: Path, warn: bool = False) -> list[Path]:
    """The complete ``step-N`` checkpoints in ``folder`` (a run's checkpoints/), oldest first; ``warn``: name each
    incomplete one on stderr."""
    found = []
    if not folder.is_dir():
        return found
    for path in folder.iterdir():
        step = step_number(path)
        if step is None or not path.is_dir():
            continue
        if (path / COMPLETE_MARKER).is_file():
            found.append((step, path))
        elif warn:
            print(f"warning: skipping incomplete checkpoint {path} (no {COMPLETE_MARKER} marker)", file=sys.stderr)
    return [path for _, path in sorted(found)]


def run_config_path(checkpoint: str | Path) -> Path:
    """The config of the run a training checkpoint belongs to: ``RUN_DIR/config.yaml`` for
    ``RUN_DIR/checkpoints/step-N`` (it may not exist, e.g. for a copied checkpoint)."""
    return Path(checkpoint).resolve().parent.parent / "config.yaml"


def read_optional_json(path: Path) -> dict:
    """A folder's optional JSON file: {} when absent; InputError (one line) when unreadable or no regular file."""
    if not is_plain_file(path):
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err})") from None


def token_text(token) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""


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
    fd = _open_no_follow(path, flags, "a lock file")
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


# -- nothing written through a link ----------------------------------------------------------------------------


def _link_refused(path: Path, what: str) -> InputError:
    return InputError(f"{path} is a symbolic link; {what} is never written through a link: remove it")


def _open_no_follow(path: Path, flags: int, what: str) -> int:
    """``path`` opened without following a link and without blocking on a FIFO; InputError naming the path when it
    is a link or no regular file (nothing is then written)."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK) and path.is_symlink():
            raise _link_refused(path, what) from None
        if err.errno == errno.ENXIO:  # a FIFO without a reader, opened to write
            raise InputError(f"{path} is not a plain file; {what} must be one: remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path} is not a plain file; {what} must be one: remove it")
    return fd


def refuse_link(path: str | Path, what: str = "a file of this project") -> Path:
    """``path``, or InputError naming it when it is a symbolic link (a check before a writer that opens by name)."""
    path = Path(path)
    if path.is_symlink():
        raise _link_refused(path, what)
    return path


def refuse_step_links(folder: Path, what: str) -> None:
    """InputError naming a link at ``folder`` or at a ``step-N`` in it (a run's exports: never written through a
    link), checked before a run starts."""
    refuse_link(folder, f"{what} folder")
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if step_number(path) is not None:
                refuse_link(path, what)


def open_to_write(path: str | Path, mode: str = "w", **kwargs):
    """``open(path, mode)`` for ``mode`` "w", "a", "wb" or "ab", but never through a link nor into anything but a
    regular file (module docstring); kwargs go to ``open``."""
    append = mode[0] == "a"
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return open(_open_no_follow(path, flags, "a file of this project"), mode, **kwargs)  # noqa: SIM115


def write_text(path: str | Path, text: str) -> Path:
    """``Path.write_text``, never through a link (:func:`open_to_write`)."""
    with open_to_write(path, "w") as handle:
        handle.write(text)
    return Path(path)


def copy_to(source: str | Path, path: str | Path) -> Path:
    """``source``'s bytes copied to ``path``, never written through a link (:func:`open_to_write`)."""
    with open(source, "rb") as read, open_to_write(path, "wb") as written:
        shutil.copyfileobj(read, written, 1 << 20)
    return Path(path)


def make_folder(path: str | Path) -> Path:
    """``path`` made (with its parents) as a folder, or InputError naming it when a link or a file is there: a
    folder the project makes inside one it writes into is never a link to somewhere else."""
    path = refuse_link(path, "a folder of this project")
    if path.exists() and not path.is_dir():
        raise InputError(f"{path} is not a folder, where this project writes one: move it elsewhere")
    path.mkdir(parents=True, exist_ok=True)
    return path


def remove_written(path: str | Path) -> None:
    """Delete the file ``path`` when it is there; InputError naming it when it is a link or a folder (only a file the
    project wrote is removed, and nothing through a link)."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise _link_refused(path, "a file of this project")
    if stat.S_ISDIR(mode):
        raise InputError(f"{path} is a folder, where this project writes a file: move it elsewhere")
    path.unlink(missing_ok=True)


def remove_written_tree(path: str | Path) -> None:
    """Delete the folder ``path`` (the project's: a checkpoint, a scratch folder) when it is there; InputError naming
    it when it is a link or a file. Links inside are removed as entries, never followed (``shutil.rmtree``)."""
    path = refuse_link(path, "a folder of this project")
    if path.exists() and not path.is_dir():
        raise InputError(f"{path} is not a folder, where this project writes one: move it elsewhere")
    shutil.rmtree(path, ignore_errors=True)


def replace_written(source: str | Path, path: str | Path) -> Path:
    """``os.replace(source, path)``: a file the project has just written moved into place; InputError naming either
    when it is a link (a link at ``path`` is not the project's to replace)."""
    refuse_link(source)
    refuse_link(path)
    os.replace(source, path)
    return Path(path)
