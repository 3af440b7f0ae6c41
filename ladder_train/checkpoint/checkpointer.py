"""Distributed checkpoints (torch.distributed.checkpoint): sharded save, atomic completion, auto-resume.

Layout: ``RUN_DIR/checkpoints/step-N/`` holds the DCP files (every rank writes its shards), ``MANIFEST.json``
(``checkpoint/integrity.py``) and a ``COMPLETE`` marker written last. A checkpoint is written as ``step-N.partial``
and renamed once complete, so a crash while saving leaves the previous checkpoints usable; a ``step-N`` folder
without the marker (cut short some other way) is skipped with a warning (``folders.complete_checkpoints``).

Contents: ``model`` and ``optim`` (DCP state dicts, resharded on load to any world size), ``trainer``
(JSON: step, tokens, scheduler, wandb run id, model shape, and on token folders the data position: the same on
every rank, restored at any world size), and per rank
``rank{r}`` (data loader position and RNG states: plain types, tensors and numeric numpy arrays; restored
only at the same world size). Checkpoints are data: they are read without running code (``checkpoint/safe_load.py``).
"""

from __future__ import annotations

import contextlib
import errno
import io
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from ..config import CheckpointConfig
from ..files import make_folder, refuse_link, remove_written_tree, write_text
from ..folders import COMPLETE_MARKER, complete_checkpoints, folder_kind
from ..parallel import together
from .integrity import (
    CheckpointError,
    checkpoint_failure,
    first_line,
    verify_checkpoint,
    write_manifest,
)
from .safe_load import describe, load_dcp, pack, pack_json, read_trainer_state, unpack


def is_main_process() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


LOW_SPACE_BYTES = 64 * 2**20  # a write that failed with less free than this is reported as a full disk
# what a write that ran out of room raises: no space, the quota used up, a file over the size limit
OUT_OF_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _out_of_room(err: BaseException) -> OSError | None:
    """The OSError of ``OUT_OF_ROOM`` behind ``err``: itself, its cause or context, or a rank's failure inside DCP's
    ``CheckpointException`` (rank: (exception, traceback))."""
    seen, todo = set(), [err]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in OUT_OF_ROOM:
            return current
        if isinstance(current, CheckpointException):
            todo.extend(failure[0] if isinstance(failure, tuple) else failure for failure in current.failures.values())
        todo.extend((current.__cause__, current.__context__))
    return None


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return None


def _megabytes(free: int | None) -> str:
    return "unknown space" if free is None else f"{free / 2**20:,.0f} MiB"


class TrainingState(Protocol):
    """What a checkpoint holds beside the model and optimizer: one entry shared by all ranks, one per rank."""

    def trainer_entry(self) -> dict: ...

    def rank_entry(self) -> dict: ...


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
            if folder_kind(path) != "checkpoint":
                raise CheckpointError(
                    f"checkpoint.load={path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)"
                )
            return path
        complete = complete_checkpoints(self.folder, warn=is_main_process())
        return complete[-1] if complete else None

    # save ---------------------------------------------------------------------------------------------

    def maybe_save(self, step: int, max_steps: int, model, optimizer, state: TrainingState) -> bool:
        """Called after every step: saves every ``checkpoint.every`` steps before the last (the trainer saves
        the last one itself) and says whether it did."""
        if not self.cfg.every or step % self.cfg.every or step >= max_steps:
            return False
        self.save(step, model, optimizer, state.trainer_entry(), state.rank_entry())
        return True

    def save(self, step: int, model, optimizer, trainer_state: dict, rank_state: dict) -> Path:
        """Write step ``step``. With ``async_save`` the files are written in the background and the
        checkpoint is completed by the next ``save`` or by ``finish``."""
        self.finish()
        final = self.folder / f"step-{step}"
        partial = self.folder / f"step-{step}.partial"
        together(lambda: self._start_folder(partial, final))  # a link there: every rank raises rank 0's line
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {
            "model": model_state,
            "optim": optim_state,
            "trainer": pack_json({**trainer_state, "world_size": self.world_size}),
            f"rank{self.rank}": pack(rank_state),
        }
        if self.cfg.async_save:
            with self._write_failures(partial):
                future = dcp.async_save(state, checkpoint_id=str(partial), process_group=self._async_group)
            self._pending = (future, partial, step)
        else:
            with self._write_failures(partial):
                dcp.save(state, checkpoint_id=str(partial))
            self._complete(partial, step)
        return final

    @contextlib.contextmanager
    def _write_failures(self, partial: Path):
        """A write that fails on a full disk or on a file-size limit surfaces from DCP as anything from
        ``OSError(ENOSPC/EFBIG)`` wrapped in its ``CheckpointException`` (a BaseException) to a torch serialization
        error ("unexpected pos ..."): the cut ``partial`` is removed and one line says what it was and what survives
        (``CheckpointError``, exit 1; the other ranks' copy is quiet). Any other failure keeps its traceback."""
        try:
            yield
        except (Exception, CheckpointException) as err:
            free = _free_bytes(partial)
            cause = _out_of_room(err)
            if cause is None and (free is None or free >= LOW_SPACE_BYTES):
                raise
            if is_main_process():  # DCP's failure reached every rank: no rank still writes into it
                remove_written_tree(partial)
            refusal = CheckpointError(self._no_room_line(partial, cause or err, free))
            refusal.quiet = not is_main_process()
            raise refusal from None

    def _no_room_line(self, partial: Path, err: BaseException, free: int | None) -> str:
        complete = complete_checkpoints(self.folder)
        resume = complete[-1] if complete else "the start (no complete checkpoint)"
        what = first_line(err)
        if isinstance(err, OSError) and err.errno in errno.errorcode:
            what += f" ({errno.errorcode[err.errno]})"
        if isinstance(err, OSError) and err.errno == errno.EFBIG:
            todo = (
                "a file outgrew the file-size limit (ulimit -f) or the file system's largest file: raise the limit "
                "or choose another folder"
            )
        else:
            todo = f"{_megabytes(free)} free on its file system; free space"
        return (
            f"writing {partial} failed ({what}), the partial checkpoint is removed: {todo}, then rerun to resume from "
            f"{resume}"
        )

    def finish(self) -> None:
        """Wait for a background save and complete it."""
        if self._pending is not None:
            future, partial, step = self._pending
            self._pending = None
            with self._write_failures(partial):
                future.result()
            self._complete(partial, step)

    @staticmethod
    def _start_folder(partial: Path, final: Path) -> None:
        """Rank 0 makes the folder every rank writes into; a link at it or at the name it gets once complete is
        refused before anything is written (files.py's rule for what the project writes)."""
        if is_main_process():
            refuse_link(final, "a folder of this project")
            remove_written_tree(partial)
            make_folder(partial)

    def _complete(self, partial: Path, step: int) -> None:
        _barrier()  # every rank's shards are on disk
        with self._write_failures(partial):  # the manifest and marker can find the disk full too
            together(lambda: self._publish(partial, step))  # rank 0's failure there ends every rank with its line

    def _publish(self, partial: Path, step: int) -> None:
        """The manifest (every rank hashes a share), then rank 0 alone: the marker, the rename, the old ones gone."""
        write_manifest(partial)
        if is_main_process():
            write_text(partial / COMPLETE_MARKER, f"step {step}\n")
            final = partial.with_name(f"step-{step}")
            remove_written_tree(final)
            partial.rename(final)
            if self.cfg.keep > 0:  # keep=0 keeps every checkpoint
                for old in complete_checkpoints(self.folder)[: -self.cfg.keep]:
                    remove_written_tree(old)

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
                rank_state = unpack(state[f"rank{self.rank}"])
            except Exception as err:
                raise checkpoint_failure(path, describe(err, f"the rank{self.rank} entry")) from None
        return trainer_state, rank_state
