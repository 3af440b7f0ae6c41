"""Whether a checkpoint's files are intact (``MANIFEST.json``: sha256 and size of every file, written before the
``COMPLETE`` marker, checked on every load; which ``step-N`` folders are complete is ``folders.complete_checkpoints``). Failures are one-line CheckpointErrors naming the folder and the previous complete one; a FIFO,
device or directory where the manifest or a file it lists belongs is an InputError naming it, found before any file
is opened (``files.is_plain_file``)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import torch.distributed as dist

from ..errors import RunFailed
from ..files import is_file_name, is_plain_file, write_text
from ..folders import COMPLETE_MARKER, complete_checkpoints, step_number

MANIFEST = "MANIFEST.json"


class CheckpointError(RunFailed):
    """A checkpoint that cannot be used here; the message names the folder and the mismatch."""


def previous_complete(path: Path) -> Path | None:
    """The newest complete checkpoint beside ``path`` with a smaller step (where to go back to)."""
    step = step_number(path)
    if step is None:
        return None
    older = [p for p in complete_checkpoints(path.parent) if (step_number(p) or 0) < step]
    return older[-1] if older else None


def checkpoint_failure(path: Path, what: str) -> CheckpointError:
    previous = previous_complete(path)
    return CheckpointError(f"{path}: {what}; the previous complete checkpoint is {previous or 'none'}")


# torch's weights-only refusal is a page that advises turning the check off; none of that is repeated here
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)|but got <class '([\w.]+)'>")
_ADVICE = (
    "weights_only",
    "Weights only load failed",
    "trusted source",
    "Please file an issue",
    "Check the documentation",
)


def refused_global(text: str) -> str | None:
    """The global (module.name) a weights-only unpickler refused, from its message; None if it names none."""
    found = _REFUSED_GLOBAL.search(text)
    return (found.group(1) or found.group(2)) if found else None


def weights_only_reason(text: str) -> str:
    """One line of what torch's weights-only unpickler refused: the global it names, else the first line of its
    reason (an opcode it does not read, a damaged stream), without the advice around it."""
    name = refused_global(text)
    if name:
        return f"it names {name}"
    body = text.split("WeightsUnpickler error:", 1)[-1]
    lines = [line.strip() for line in body.splitlines() if line.strip() and not any(a in line for a in _ADVICE)]
    return lines[0] if lines else "not plain data and tensors"


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    if any(advice in text for advice in _ADVICE):
        text = weights_only_reason(text)
    else:
        text = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def group_rank_size(group) -> tuple[int, int]:
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


# checksums ------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _shared_list(items: list, group=None) -> list:
    """Rank 0's list on every rank (the folder listing every rank then splits)."""
    if group_rank_size(group)[1] == 1:
        return items
    box = [items]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    return box[0]


def _gathered(items: list, group=None) -> list:
    rank, world = group_rank_size(group)
    if world == 1:
        return items
    parts: list = [None] * world
    dist.all_gather_object(parts, items, group=group)
    return [item for part in parts for item in part]


def write_manifest(folder: Path) -> None:
    """Every rank hashes a share of the folder's files (shared filesystem); rank 0 writes the manifest."""
    rank, world = group_rank_size(None)
    names = _shared_list(
        sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in (MANIFEST, COMPLETE_MARKER))
    )
    mine = [(name, (folder / name).stat().st_size, _sha256(folder / name)) for name in names[rank::world]]
    entries = _gathered(mine)
    if rank == 0:
        files = {name: {"bytes": size, "sha256": digest} for name, size, digest in sorted(entries)}
        write_text(folder / MANIFEST, json.dumps({"files": files}, indent=1) + "\n")


# files this process has checked against a manifest -> (device, inode, size, mtime, the manifest's sha256) then: a
# command that opens a checkpoint several times (its shape, then its weights) hashes each file once, again if changed
_VERIFIED: dict[Path, tuple] = {}
_NOTED: set[Path] = set()  # checkpoints without a manifest this process has said so of


def _check_file(folder: Path, name: str, expected: dict) -> str | None:
    path = folder / name
    if not is_plain_file(path):
        return f"{name} is missing"
    info = path.stat()
    if info.st_size != expected["bytes"]:
        return f"{name} has {info.st_size} bytes, the manifest says {expected['bytes']}"
    stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, expected["sha256"])
    key = path.resolve()
    if _VERIFIED.get(key) == stamp:
        return None
    if _sha256(path) != expected["sha256"]:
        return f"{name} does not match its checksum in {MANIFEST} (corrupted)"
    _VERIFIED[key] = stamp
    return None


def _manifest_files(path: Path) -> tuple[dict, str | None]:
    """(name -> {bytes, sha256}, None) of a checkpoint's manifest, or ({}, the problem) when it cannot be used. Every
    name must be a file name inside the folder, and a FIFO, device or directory under one raises InputError: told
    from the file system's metadata alone, so every rank reaches the same verdict before any file is opened."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        return {}, f"{MANIFEST} is unreadable ({first_line(err)})"
    if not isinstance(files, dict):
        return {}, f"{MANIFEST} is unreadable (its files are a {type(files).__name__}, not an object)"
    for name in sorted(files):
        if not is_file_name(name):
            return {}, f"{MANIFEST} lists {name!r}, not a file name inside the folder"
        is_plain_file(path / name)  # raises for anything but a regular file or nothing
    return files, None


def verify_checkpoint(path: Path, group=None, no_dist: bool = False) -> None:
    """Check that ``path`` is a complete checkpoint whose files match its manifest, else raise a one-line
    CheckpointError (InputError for a FIFO, device or directory where the manifest or a file it lists belongs). With
    a process group every rank checks a share of the files and all get the verdict. A checkpoint written before
    manifests existed loads unverified, with a note. A file is hashed once per process while it stays unchanged."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such folder")
    if not is_plain_file(path / COMPLETE_MARKER):
        raise CheckpointError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    rank, world = (0, 1) if no_dist else group_rank_size(group)
    if not is_plain_file(path / MANIFEST):
        if rank == 0 and path.resolve() not in _NOTED:
            print(f"note: {path} has no {MANIFEST} (no checksums to verify): loading it unverified", file=sys.stderr)
            _NOTED.add(path.resolve())
        return
    files, problem = _manifest_files(path)
    problems = [problem] if problem else []
    try:
        problems += [p for name in sorted(files)[rank::world] if (p := _check_file(path, name, files[name]))]
    except (KeyError, TypeError) as err:
        problems = [f"{MANIFEST} is unreadable ({first_line(err)})"]
    if world > 1:
        problems = _gathered(problems, group)
    if problems:
        more = f" (and {len(problems) - 1} more files)" if len(problems) > 1 else ""
        raise checkpoint_failure(path, problems[0] + more)
