"""The OUT_DIR of ``ladder-data prepare``: what may already be there, and one prepare at a time.

Nothing a user wrote is deleted or overwritten. A folder is taken when it is new or empty; one that holds a token
folder or the leftovers of an unfinished prepare only with ``--overwrite``, which replaces prepare's own files
(:data:`OWN_FILES`, the parts in ``.parts/``) and nothing else: a file of another name beside them stays, and
one inside ``.parts/`` stops the prepare before any work.

While a prepare works it holds ``OUT_DIR/.ladder-data.lock`` (folder_lock.lock_folder, the trainer's run.dir lock too):
a second prepare into the folder is refused in one line naming the holder. The kernel drops the lock when its process
dies, however it dies, so a lock file left by a killed prepare blocks nothing; the file is removed on a normal exit.
A link planted where the lock file, ``.parts/`` or one of prepare's files belongs is refused in one line
(files.py's rule for every file the project writes), and what it points at is not touched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import DataError
from ..files import refuse_link, remove_written
from ..folder_lock import LockHeld, lock_folder, lock_holder
from ..folders import TOKEN_FOLDER_META
from .token_files import OFFSETS_NAME, TOKENS_NAME

PARTS = ".parts"  # the folder's scratch space while it is being written
LOCK_NAME = ".ladder-data.lock"
PARTIAL_META = TOKEN_FOLDER_META + ".partial"  # token_files.write_meta's temporary name
OWN_FILES = (TOKENS_NAME, OFFSETS_NAME, TOKEN_FOLDER_META, PARTIAL_META, LOCK_NAME)
# in .parts/: one task's tokens and document lengths, and the two files being assembled
OWN_PART = re.compile(rf"(\d{{6}}\.(tokens|lengths)|{re.escape(TOKENS_NAME)}|{re.escape(OFFSETS_NAME)})")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse ``out`` in one line unless prepare may write there (module docstring); reads names only."""
    if out.exists() and not out.is_dir():
        raise DataError(f"OUT_DIR: {out} exists and is not a folder")
    if not out.exists():
        return
    if holder := lock_holder(out, LOCK_NAME):
        raise _in_use(out, holder)
    check_contents(out, overwrite)


def check_contents(out: Path, overwrite: bool) -> None:
    """The part of check_out_dir that reads the folder's names (done again once the lock is held)."""
    names = sorted(os.listdir(out))
    own = [name for name in names if name in OWN_FILES or name == PARTS]
    if not overwrite and TOKEN_FOLDER_META in names:
        raise DataError(
            f"OUT_DIR: {out} already holds a token folder ({TOKEN_FOLDER_META}); pass --overwrite to replace it, or "
            "choose another folder"
        )
    if not overwrite and len(own) < len(names):
        foreign = [name for name in names if name not in own]
        raise DataError(f"OUT_DIR: {out} is not empty (it holds {_shown(foreign)}); choose a new or empty folder")
    if not overwrite and own and own != [LOCK_NAME]:
        raise DataError(
            f"OUT_DIR: {out} holds the files of an unfinished ladder-data prepare ({_shown(own)}); pass --overwrite "
            "to replace them, or choose another folder"
        )
    _check_own_kinds(out, own)


def _check_own_kinds(out: Path, own: list[str]) -> None:
    """What --overwrite would replace must be prepare's: files by prepare's names, a .parts folder of parts."""
    for name in own:
        path = refuse_link(out / name, "a file of ladder-data prepare")
        if name != PARTS and path.is_dir():
            raise DataError(f"OUT_DIR: {path} is a folder, not a file ladder-data prepare writes; move it elsewhere")
    parts = out / PARTS
    if parts.exists() and not parts.is_dir():
        raise DataError(f"OUT_DIR: {parts} is a file, not ladder-data prepare's parts folder; move it elsewhere")
    if parts.is_dir():
        foreign = sorted(p.name for p in parts.iterdir() if not OWN_PART.fullmatch(p.name) or p.is_dir())
        if foreign:
            raise DataError(
                f"OUT_DIR: {parts} holds files ladder-data prepare did not write ({_shown(foreign)}); move them "
                "elsewhere (--overwrite replaces only prepare's own files)"
            )


def remove_parts(out: Path) -> None:
    """Delete prepare's own files in ``.parts/`` (and the folder once empty) and a metadata file left half written;
    anything else stays."""
    parts = refuse_link(out / PARTS, "ladder-data prepare's parts folder")
    if parts.is_dir():
        for path in parts.iterdir():
            if OWN_PART.fullmatch(path.name) and not path.is_dir():
                remove_written(path)
        if not any(parts.iterdir()):
            parts.rmdir()
    remove_written(out / PARTIAL_META)


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock for the block (folder_lock.lock_folder), or raise DataError naming the folder and the holder;
    the lock file is removed at the end."""
    try:
        lock = lock_folder(out, LOCK_NAME, "ladder-data prepare into it")
    except LockHeld as err:
        raise _in_use(out, err.holder) from None
    try:
        yield
    finally:
        lock.close(remove=True)  # removed while still held: a prepare that opened the file finds it gone, and retries


def _in_use(out: Path, holder: str) -> DataError:
    return DataError(f"OUT_DIR: {out} is in use by another ladder-data prepare ({holder}); wait for it to end")
