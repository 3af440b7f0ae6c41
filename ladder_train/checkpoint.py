"""Distributed checkpoints (torch.distributed.checkpoint): sharded save, atomic completion, auto-resume.

Layout: ``RUN_DIR/checkpoints/step-N/`` holds the DCP files (every rank writes its shards) and a
``COMPLETE`` marker written last. A checkpoint is written as ``step-N.partial`` and renamed once
complete, so a crash while saving leaves the previous checkpoints usable; a ``step-N`` folder without
the marker (cut short some other way) is skipped with a warning.

Contents: ``model`` and ``optim`` (DCP state dicts, resharded on load to any world size), ``trainer``
(step, tokens, scheduler, wandb run id, model shape: the same on every rank), and per rank
``rank{r}`` (data loader position and RNG states: restored only at the same world size).
"""

from __future__ import annotations

import io
import re
import shutil
import sys
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from .config import CheckpointConfig

COMPLETE_MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used here; the message names the folder and the mismatch."""


def _pack(obj: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def _unpack(buffer: io.BytesIO) -> Any:
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


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
    state = {"trainer": io.BytesIO()}
    with warnings.catch_warnings():  # each rank reads the one small entry itself, on purpose
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return _unpack(state["trainer"])


def model_from_checkpoint(path: str | Path, device: str | torch.device = "cpu"):
    """The full (unsharded) model of a training checkpoint, in one process, whatever world saved it."""
    from .model import ModelArgs, Transformer

    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    args = ModelArgs(**read_trainer_state(path)["model_args"])
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=device)
    model.init_rope()
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
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
            if not (path / COMPLETE_MARKER).is_file():
                raise CheckpointError(
                    f"checkpoint.load={path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)"
                )
            return path
        complete = complete_checkpoints(self.folder)
        return complete[-1] if complete else None

    # save ---------------------------------------------------------------------------------------------

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
            "trainer": _pack({**trainer_state, "world_size": self.world_size}),
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
        if _is_main():
            (partial / COMPLETE_MARKER).write_text(f"step {step}\n")
            final = partial.with_name(f"step-{step}")
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            for old in complete_checkpoints(self.folder, warn=False)[: -self.cfg.keep or None]:
                shutil.rmtree(old, ignore_errors=True)
        _barrier()

    # load ---------------------------------------------------------------------------------------------

    def load(self, path: Path, model, optimizer, expected_model: dict, model_only: bool) -> tuple[dict, dict | None]:
        """Restore from ``path``; returns (trainer state, this rank's state or None when the world size
        changed or only weights were asked for). The model shape is checked before any tensor is read."""
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
            dcp.load(state, checkpoint_id=str(path))
            set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
            return trainer_state, None
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        same_world = trainer_state["world_size"] == self.world_size
        if same_world:
            state[f"rank{self.rank}"] = io.BytesIO()
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rank_state = _unpack(state[f"rank{self.rank}"]) if same_world else None
        return trainer_state, rank_state
