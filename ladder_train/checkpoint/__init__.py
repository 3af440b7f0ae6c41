"""Training checkpoints: saving and resuming (``checkpointer``), whether a checkpoint's files are intact
(``integrity``: MANIFEST.json; which ``step-N`` folders are complete is ``ladder_train.folders``'s), and reading
entries without running code (``safe_load``)."""

from .checkpointer import Checkpointer
from .integrity import MANIFEST, CheckpointError, first_line, verify_checkpoint
from .safe_load import load_dcp, read_trainer_state

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "Checkpointer",
    "first_line",
    "load_dcp",
    "read_trainer_state",
    "verify_checkpoint",
]
