"""The rules for the files of a checkpoint, model, run or token folder.

The one check every reader of a checkpoint or model folder makes before it opens a file (:func:`is_plain_file`):
a regular file, told from its metadata alone, so that a FIFO, socket or device put where a file belongs is refused
in one line instead of blocking or acting when opened.

And the one rule for every file the project writes into a folder it does not own alone (a run folder, OUT_DIR, a
study's --collect DEST, a checkpoint, an export): nothing is written, removed or renamed through a symbolic link.
A file is opened with ``O_NOFOLLOW`` (:func:`open_to_write`, :func:`write_text`, :func:`copy_to`), a folder the
project makes inside such a folder is no link (:func:`make_folder`), and only an entry that is what the project
writes is removed or replaced (:func:`remove_written`, :func:`remove_written_tree`, :func:`replace_written`); a link
there is refused in one line naming it (InputError), and what it points at is untouched. The folder a user names
(run.dir, OUT_DIR, DEST, an export's OUT, a run's ``checkpoints/`` put on another disk) may itself be a link."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from .errors import InputError

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


# -- nothing written through a link ----------------------------------------------------------------------------


def _link_refused(path: Path, what: str) -> InputError:
    return InputError(f"{path} is a symbolic link; {what} is never written through a link: remove it")


def open_no_follow(path: Path, flags: int, what: str) -> int:
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


def open_to_write(path: str | Path, mode: str = "w", **kwargs):
    """``open(path, mode)`` for ``mode`` "w", "a", "wb" or "ab", but never through a link nor into anything but a
    regular file (module docstring); kwargs go to ``open``."""
    append = mode[0] == "a"
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return open(open_no_follow(path, flags, "a file of this project"), mode, **kwargs)  # noqa: SIM115


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
