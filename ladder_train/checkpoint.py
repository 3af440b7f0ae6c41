"""Distributed checkpoints (torch.distributed.checkpoint): sharded save, atomic completion, auto-resume.

Layout: ``RUN_DIR/checkpoints/step-N/`` holds the DCP files (every rank writes its shards) and a
``COMPLETE`` marker written last. A checkpoint is written as ``step-N.partial`` and renamed once
complete, so a crash while saving leaves the previous checkpoints usable; a ``step-N`` folder without
the marker (cut short some other way) is skipped with a warning.

Contents: ``model`` and ``optim`` (DCP state dicts, resharded on load to any world size), ``trainer``
(JSON: step, tokens, scheduler, wandb run id, model shape: the same on every rank), and per rank
``rank{r}`` (data loader position and RNG states: plain types, tensors and numeric numpy arrays; restored
only at the same world size). ``MANIFEST.json`` (sha256 and size of every file) is written before the marker and checked
on every load.

Checkpoints are data: they are read without running code. DCP's own readers unpickle ``.metadata`` and
every non-tensor entry with ``pickle``/``torch.load(weights_only=False)``; here both go through
restricted loaders that build only plain containers, tensors and DCP's metadata classes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import socket
import sys
import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from .config import CheckpointConfig

COMPLETE_MARKER = "COMPLETE"
MANIFEST = "MANIFEST.json"
LOCK_FILE = "run.lock"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used here; the message names the folder and the mismatch."""


class RunDirLocked(CheckpointError):
    """Another trainer holds run.dir. ``quiet`` on ranks other than 0, so the message is printed once."""

    def __init__(self, message: str, quiet: bool = False):
        super().__init__(message)
        self.quiet = quiet


# writing: the trainer entry is JSON; a rank's entry is torch.save of plain types and tensors ---------------


def _pack_json(obj: dict) -> io.BytesIO:
    return io.BytesIO(json.dumps(obj).encode())


def _pack(obj: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


# reading without running code -----------------------------------------------------------------------------


class _RefusedObject(pickle.UnpicklingError):
    pass


def _numpy_globals() -> list:
    """What a numeric numpy array needs to unpickle (the data loader's token buffer is one); object arrays,
    whose dtype is not listed, stay refused."""
    import numpy as np

    core = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    dtypes = {type(np.dtype(code)) for code in "?bhilqBHILQefdgFD"}
    return [core._reconstruct, core.scalar, np.ndarray, np.dtype, *dtypes]


def _unpack(buffer: io.BytesIO) -> Any:
    """A JSON entry, or a ``torch.save`` entry holding only plain types, tensors and numeric numpy arrays
    (older trainer entries, rank entries). Anything else is refused, never constructed."""
    raw = buffer.getvalue()
    if raw[:1] == b"{":
        return json.loads(raw)
    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(io.BytesIO(raw), weights_only=True)


class _DataOnlyPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner.load_bytes unpickles every non-tensor entry with weights_only=False; here the
    entry (DCP wraps each one in torch.save) may hold plain types and a BytesIO only."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            with torch.serialization.safe_globals([io.BytesIO]):
                obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise pickle.UnpicklingError(f"[entry {fqn}] {_first_line(err)}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def _metadata_global(module: str, name: str):
    """The globals a DCP ``.metadata`` pickle may name: its own record classes, torch dtypes/layouts/sizes,
    paths. Calling any of them with any arguments only builds a value."""
    import pathlib

    import torch.distributed.checkpoint.filesystem as dcp_fs
    import torch.distributed.checkpoint.metadata as dcp_md

    if module == "torch.distributed.checkpoint.metadata" and isinstance(getattr(dcp_md, name, None), type):
        return getattr(dcp_md, name)
    if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
        return dcp_fs._StorageInfo
    if module == "torch":
        value = getattr(torch, name, None)
        if name == "Size" or isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return value
    if module == "torch.serialization" and name == "_get_layout":
        return torch.serialization._get_layout
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath"):
        return getattr(pathlib, name)
    if module == "collections" and name == "OrderedDict":
        import collections

        return collections.OrderedDict
    raise _RefusedObject(f".metadata names {module}.{name}, which a checkpoint's metadata never holds")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return _metadata_global(module, name)


class _DataOnlyReader(dcp.FileSystemReader):
    """FileSystemReader unpickles ``.metadata`` with plain pickle; here only DCP's record types are built."""

    def __init__(self, path: str):
        super().__init__(path)
        self._metadata = None

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        if rank is None and self._metadata is not None:  # read up front by load_dcp
            return self._metadata
        with self.fs.create_stream(self._get_metadata_path(rank), "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _step_of(path: Path) -> int | None:
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def previous_complete(path: Path) -> Path | None:
    """The newest complete checkpoint beside ``path`` with a smaller step (where to go back to)."""
    step = _step_of(path)
    if step is None:
        return None
    older = [p for p in complete_checkpoints(path.parent, warn=False) if (_step_of(p) or 0) < step]
    return older[-1] if older else None


def _failure(path: Path, what: str) -> CheckpointError:
    previous = previous_complete(path)
    return CheckpointError(f"{path}: {what}; the previous complete checkpoint is {previous or 'none'}")


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    # torch's weights_only refusal is a page of advice; the line that matters names the global
    named = [line.strip().split(" Please use")[0] for line in lines if "Unsupported global" in line]
    text = named[0] if named else (lines[0] if lines else "")
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _describe(err: BaseException, entry: str = "an entry") -> str:
    """One line for a failed read; DCP's CheckpointException carries each rank's exception and traceback."""
    if isinstance(err, CheckpointException):
        for failure in err.failures.values():
            return _describe(failure[0] if isinstance(failure, tuple) else failure, entry)
    if isinstance(err, _RefusedObject):
        return f"refused to read it: {err}"
    if isinstance(err, pickle.UnpicklingError):
        text = str(err)
        if text.startswith("[entry "):  # from _DataOnlyPlanner: the entry is named, the cause is one line
            name, _, text = text[len("[entry ") :].partition("] ")
            return f"refused to read it: the {name} entry holds more than plain data and tensors ({text})"
        return f"refused to read it: {entry} holds more than plain data and tensors ({_first_line(err)})"
    return f"cannot be read ({_first_line(err)})"


def _group_rank_size(group) -> tuple[int, int]:
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def load_dcp(state: dict, path: Path, group=None, no_dist: bool = False, verify: bool = False) -> None:
    """``dcp.load`` of ``state`` from ``path`` without running code, with failures as one-line
    CheckpointErrors naming the folder and the previous complete checkpoint; ``verify`` checks the
    manifest first. Every reader of training checkpoints goes through here."""
    path = Path(path)
    if verify:
        verify_checkpoint(path, group=None if no_dist else group, no_dist=no_dist)
    reader = _DataOnlyReader(str(path))
    try:
        # read here first: a failure inside dcp.load is logged with a traceback before it is raised
        reader._metadata = reader.read_metadata()
        with warnings.catch_warnings():  # single-process reads (no_dist) on purpose
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                state,
                storage_reader=reader,
                planner=_DataOnlyPlanner(),
                process_group=group,
                no_dist=no_dist,
            )
    except (CheckpointException, Exception) as err:  # CheckpointException is a BaseException
        raise _failure(path, _describe(err)) from None


# checksums ------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _shared_list(items: list, group=None) -> list:
    """Rank 0's list on every rank (the folder listing every rank then splits)."""
    if _group_rank_size(group)[1] == 1:
        return items
    box = [items]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    return box[0]


def _gathered(items: list, group=None) -> list:
    rank, world = _group_rank_size(group)
    if world == 1:
        return items
    parts: list = [None] * world
    dist.all_gather_object(parts, items, group=group)
    return [item for part in parts for item in part]


def _write_manifest(folder: Path) -> None:
    """Every rank hashes a share of the folder's files (shared filesystem); rank 0 writes the manifest."""
    rank, world = _group_rank_size(None)
    names = _shared_list(
        sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in (MANIFEST, COMPLETE_MARKER))
    )
    mine = [(name, (folder / name).stat().st_size, _sha256(folder / name)) for name in names[rank::world]]
    entries = _gathered(mine)
    if rank == 0:
        files = {name: {"bytes": size, "sha256": digest} for name, size, digest in sorted(entries)}
        (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n")


def _check_file(folder: Path, name: str, expected: dict) -> str | None:
    path = folder / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != expected["bytes"]:
        return f"{name} has {size} bytes, the manifest says {expected['bytes']}"
    if _sha256(path) != expected["sha256"]:
        return f"{name} does not match its checksum in {MANIFEST} (corrupted)"
    return None


def verify_checkpoint(path: Path, group=None, no_dist: bool = False) -> None:
    """Check that ``path`` is a complete checkpoint whose files match its manifest, else raise a one-line
    CheckpointError. With a process group every rank checks a share of the files and all get the verdict.
    A checkpoint written before manifests existed loads unverified, with a note."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such folder")
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    rank, world = (0, 1) if no_dist else _group_rank_size(group)
    manifest = path / MANIFEST
    if not manifest.is_file():
        if rank == 0:
            print(f"note: {path} has no {MANIFEST} (written before checksums): loading it unverified", file=sys.stderr)
        return
    try:
        files = json.loads(manifest.read_text())["files"]
        names = sorted(files)
        problems = [p for name in names[rank::world] if (p := _check_file(path, name, files[name]))]
    except (ValueError, KeyError, TypeError) as err:
        problems = [f"{MANIFEST} is unreadable ({_first_line(err)})"]
    if world > 1:
        problems = _gathered(problems, group)
    if problems:
        more = f" (and {len(problems) - 1} more files)" if len(problems) > 1 else ""
        raise _failure(path, problems[0] + more)


# the run directory lock -----------------------------------------------------------------------------------


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


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def complete_checkpoints(folder: Path, warn: bool = True) -> list[Path]:
    """The complete ``step-N`` checkpoints in ``folder``, oldest first; incomplete ones are named once."""
    found = []
    if not folder.is_dir():
        return found
    for path in folder.iterdir():
        match = _STEP_DIR.match(path.name)
        if not match or not path.is_dir():
            continue
        if (path / COMPLETE_MARKER).is_file():
            found.append((int(match.group(1)), path))
        elif warn and _is_main():
            print(f"warning: skipping incomplete checkpoint {path} (no {COMPLETE_MARKER} marker)", file=sys.stderr)
    return [path for _, path in sorted(found)]


def read_trainer_state(path: Path) -> dict:
    """The ``trainer`` entry of a checkpoint (step, model shape, ...) without loading any tensor."""
    path = Path(path)
    state = {"trainer": io.BytesIO()}
    load_dcp(state, path, no_dist=True)  # each rank reads the one small entry itself, on purpose
    try:
        return _unpack(state["trainer"])
    except Exception as err:
        raise _failure(path, _describe(err, "the trainer entry")) from None


def model_from_checkpoint(path: str | Path, device: str | torch.device = "cpu"):
    """The full (unsharded) model of a training checkpoint, in one process, whatever world saved it."""
    from .model import ModelArgs, Transformer

    path = Path(path)
    verify_checkpoint(path, no_dist=True)
    args = ModelArgs(**read_trainer_state(path)["model_args"])
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=device)
    model.init_rope()
    state = {"model": model.state_dict()}
    load_dcp(state, path, no_dist=True)
    model.load_state_dict(state["model"])
    return model


class Checkpointer:
    """Saves and restores the training state of one run; every rank calls every method."""

    def __init__(self, cfg: CheckpointConfig, run_dir: Path, rank: int, world_size: int):
        self.cfg = cfg
        self.folder = run_dir / "checkpoints"
        self.rank, self.world_size = rank, world_size
        self._pending: tuple[Future, Path, int] | None = None
        self._async_group = None
        if cfg.async_save and dist.is_initialized():
            # background writes use their own gloo group so they never queue behind training's NCCL work
            self._async_group = dist.new_group(backend="gloo")

    # what to resume from ------------------------------------------------------------------------------

    def resume_path(self) -> Path | None:
        """``checkpoint.load`` if set, else the newest complete checkpoint of this run (or None)."""
        if self.cfg.load:
            path = Path(self.cfg.load)
            if not path.is_dir():
                raise CheckpointError(f"checkpoint.load={path}: no such folder")
            if not (path / COMPLETE_MARKER).is_file():
                raise CheckpointError(
                    f"checkpoint.load={path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)"
                )
            return path
        complete = complete_checkpoints(self.folder)
        return complete[-1] if complete else None

    # save ---------------------------------------------------------------------------------------------

    def periodic_save_due(self, step: int, max_steps: int) -> bool:
        """Every ``checkpoint.every`` steps before the last (the trainer saves the last one anyway)."""
        return bool(self.cfg.every) and step % self.cfg.every == 0 and step < max_steps

    def save(self, step: int, model, optimizer, trainer_state: dict, rank_state: dict) -> Path:
        """Write step ``step``. With ``async_save`` the files are written in the background and the
        checkpoint is completed by the next ``save`` or by ``finish``."""
        self.finish()
        final = self.folder / f"step-{step}"
        partial = self.folder / f"step-{step}.partial"
        if _is_main():
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        _barrier()
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {
            "model": model_state,
            "optim": optim_state,
            "trainer": _pack_json({**trainer_state, "world_size": self.world_size}),
            f"rank{self.rank}": _pack(rank_state),
        }
        if self.cfg.async_save:
            future = dcp.async_save(state, checkpoint_id=str(partial), process_group=self._async_group)
            self._pending = (future, partial, step)
        else:
            dcp.save(state, checkpoint_id=str(partial))
            self._complete(partial, step)
        return final

    def finish(self) -> None:
        """Wait for a background save and complete it."""
        if self._pending is not None:
            future, partial, step = self._pending
            self._pending = None
            future.result()
            self._complete(partial, step)

    def _complete(self, partial: Path, step: int) -> None:
        _barrier()  # every rank's shards are on disk
        _write_manifest(partial)
        if _is_main():
            (partial / COMPLETE_MARKER).write_text(f"step {step}\n")
            final = partial.with_name(f"step-{step}")
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            if self.cfg.keep > 0:  # keep=0 keeps every checkpoint
                for old in complete_checkpoints(self.folder, warn=False)[: -self.cfg.keep]:
                    shutil.rmtree(old, ignore_errors=True)
        _barrier()

    # load ---------------------------------------------------------------------------------------------

    def load(self, path: Path, model, optimizer, expected_model: dict, model_only: bool) -> tuple[dict, dict | None]:
        """Restore from ``path``; returns (trainer state, this rank's state or None when the world size
        changed or only weights were asked for). The files are checked against the manifest and the model
        shape before any tensor is read."""
        verify_checkpoint(path)
        trainer_state = read_trainer_state(path)
        saved_model = trainer_state.get("model_args", {})
        mismatched = [
            f"{k}: checkpoint {saved_model.get(k)!r}, run {v!r}"
            for k, v in expected_model.items()
            if saved_model.get(k) != v
        ]
        if mismatched:
            raise CheckpointError(f"{path}: the checkpoint's model differs from this run's ({'; '.join(mismatched)})")
        if model_only:
            state = {"model": get_model_state_dict(model)}
            load_dcp(state, path)
            set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
            return trainer_state, None
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        same_world = trainer_state["world_size"] == self.world_size
        if same_world:
            state[f"rank{self.rank}"] = io.BytesIO()
        load_dcp(state, path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rank_state = None
        if same_world:
            try:
                rank_state = _unpack(state[f"rank{self.rank}"])
            except Exception as err:
                raise _failure(path, _describe(err, f"the rank{self.rank} entry")) from None
        return trainer_state, rank_state
