"""Training checkpoints: saving and resuming (``checkpointer``), which folders are complete and intact
(``files``: the COMPLETE marker and MANIFEST.json), reading entries without running code (``safe_load``), and
a checkpoint to a Hugging Face Llama folder (``export``: ``from ladder_train.checkpoint.export import
export_checkpoint``; not re-exported here, since it loads models through ``ladder_train.loading``, which reads
checkpoints through this package)."""

from .checkpointer import Checkpointer
from .files import COMPLETE_MARKER, MANIFEST, CheckpointError, complete_checkpoints, verify_checkpoint
from .safe_load import load_dcp, read_trainer_state

__all__ = [
    "COMPLETE_MARKER",
    "MANIFEST",
    "CheckpointError",
    "Checkpointer",
    "complete_checkpoints",
    "load_dcp",
    "read_trainer_state",
    "verify_checkpoint",
]
