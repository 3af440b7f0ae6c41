"""Training checkpoints: saving and resuming (``checkpointer``), which folders are complete and intact
(``files``: the COMPLETE marker, named in ``ladder_train.folders``, and MANIFEST.json), and reading entries without
running code (``safe_load``)."""

from .checkpointer import Checkpointer
from .integrity import MANIFEST, CheckpointError, complete_checkpoints, first_line, verify_checkpoint
from .safe_load import load_dcp, read_trainer_state

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "Checkpointer",
    "complete_checkpoints",
    "first_line",
    "load_dcp",
    "read_trainer_state",
    "verify_checkpoint",
]
