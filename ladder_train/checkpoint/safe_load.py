"""Checkpoint entries as data. Written: the ``trainer`` entry as JSON, a rank's entry as ``torch.save`` of plain
types and tensors. Read without running code: DCP's own readers unpickle ``.metadata`` and every non-tensor
entry with ``pickle`` / ``torch.load(weights_only=False)``; here both go through restricted loaders that build
only plain containers, tensors and DCP's metadata classes. Nothing is opened before it is known to be a regular
file inside the folder (``files.is_plain_file``): a FIFO or device there is refused in one line, never waited on."""

from __future__ import annotations

import inspect
import io
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from ..errors import InputError
from ..files import is_file_name, is_plain_file
from ..folders import DCP_METADATA, step_number
from .integrity import (
    checkpoint_failure,
    first_line,
    refused_global,
    verify_checkpoint,
    weights_only_reason,
)

# writing ----------------------------------------------------------------------------------------------------


def pack_json(obj: dict) -> io.BytesIO:
    return io.BytesIO(json.dumps(obj).encode())


def pack(obj: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


# reading ----------------------------------------------------------------------------------------------------


class _RefusedObject(pickle.UnpicklingError):
    pass


class _UnreadableEntry(pickle.UnpicklingError):
    """An entry the weights-only unpickler would not read, with torch's whole message (refused_global reads it)."""

    def __init__(self, entry: str, message: str):
        super().__init__(message)
        self.entry = entry


def _numpy_globals() -> list:
    """What a numeric numpy array needs to unpickle (the data loader's token buffer is one); object arrays,
    whose dtype is not listed, stay refused."""
    import numpy as np

    core = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    dtypes = {type(np.dtype(code)) for code in "?bhilqBHILQefdgFD"}
    return [core._reconstruct, core.scalar, np.ndarray, np.dtype, *dtypes]


def unpack(buffer: io.BytesIO) -> Any:
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
            raise _UnreadableEntry(f"the {fqn} entry", str(err)) from None
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


class _MetadataUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (the C one's opcodes cannot be intercepted): only the globals above, and BUILD
    (state set on an object) only on instances: never attributes of a class or module."""

    def find_class(self, module: str, name: str):
        return _metadata_global(module, name)

    def load_build(self):
        target = self.stack[-2]
        if isinstance(target, type) or inspect.ismodule(target) or inspect.isroutine(target):
            raise _RefusedObject(
                f".metadata sets state on {getattr(target, '__qualname__', target)!r}, not on an object"
            )
        super().load_build()

    dispatch = {**pickle._Unpickler.dispatch, pickle.BUILD[0]: load_build}


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
        path = self._get_metadata_path(rank)
        is_plain_file(path)  # a FIFO or device raises InputError here, unopened; a missing file fails to open below
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def describe(err: BaseException, entry: str = "an entry") -> str:
    """One line for a failed read; DCP's CheckpointException carries each rank's exception and traceback."""
    if isinstance(err, CheckpointException):
        for failure in err.failures.values():
            return describe(failure[0] if isinstance(failure, tuple) else failure, entry)
    if isinstance(err, _RefusedObject):
        return f"refused to read it: {err}"
    if isinstance(err, _UnreadableEntry):
        entry = err.entry
    if isinstance(err, pickle.UnpicklingError):
        name = refused_global(str(err))
        if name:
            return f"refused to read it: {entry} names {name}, which a checkpoint never holds (only plain data and tensors are read)"
        return f"cannot be read: {entry} is not plain data and tensors, or is damaged ({weights_only_reason(str(err))})"
    return f"cannot be read ({first_line(err)})"


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
    except InputError:
        raise
    except Exception as err:
        raise checkpoint_failure(path, describe(err)) from None
    _check_storage_files(path, reader._metadata)
    try:
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
        raise checkpoint_failure(path, describe(err)) from None


def _check_storage_files(path: Path, metadata) -> None:
    """Every file ``.metadata`` says holds an entry is a file name inside the folder and, when there, a regular file
    (InputError naming it otherwise), all before DCP opens any: a FIFO among them would block the read for ever."""
    infos = getattr(metadata, "storage_data", None)
    seen = set()
    for info in infos.values() if isinstance(infos, dict) else ():
        name = getattr(info, "relative_path", None)
        if not is_file_name(name):
            raise checkpoint_failure(
                path, f"refused to read it: {DCP_METADATA} names {name!r}, not a file in the folder"
            )
        if name not in seen:
            seen.add(name)
            is_plain_file(path / name)  # a missing one fails to open in the read, as before


def read_trainer_state(path: Path) -> dict:
    """The ``trainer`` entry of a checkpoint (step, model shape, ...) without loading any tensor."""
    path = Path(path)
    state = {"trainer": io.BytesIO()}
    load_dcp(state, path, no_dist=True)  # each rank reads the one small entry itself, on purpose
    try:
        entry = unpack(state["trainer"])
    except Exception as err:
        raise checkpoint_failure(path, describe(err, "the trainer entry")) from None
    check_trainer_counters(path, entry)
    return entry


def check_trainer_counters(path: Path, entry) -> None:
    """The counters a resume continues from and an export reports: whole numbers >= 0, and the step the folder's
    name says (``step-N``). A hand-made entry would otherwise train from step -6 or end at once."""
    if not isinstance(entry, dict):
        raise checkpoint_failure(path, f"the trainer entry is a {type(entry).__name__}, not a mapping")
    for key in ("step", "tokens_seen", "world_size"):
        if key not in entry:
            continue
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "world_size" else 0):
            raise checkpoint_failure(path, f"the trainer entry's {key} is {value!r}, not a whole number in range")
    numbered = step_number(path)
    if "step" in entry and numbered is not None and entry["step"] != numbered:
        raise checkpoint_failure(
            path, f"the trainer entry's step is {entry['step']}, but the folder is step-{numbered}"
        )
