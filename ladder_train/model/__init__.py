"""The model: one Transformer definition (training and inference), presets and the export format."""

from .hf_format import INDEX_FILE, WEIGHTS_FILE
from .presets import PRESETS, preset_args
from .transformer import (
    NO_COMM,
    RESIDUAL_LAYOUTS,
    Communicator,
    ModelArgs,
    Transformer,
    build_on_meta,
    count_params,
    flops_per_token,
)

__all__ = [
    "INDEX_FILE",
    "NO_COMM",
    "PRESETS",
    "RESIDUAL_LAYOUTS",
    "Communicator",
    "ModelArgs",
    "Transformer",
    "WEIGHTS_FILE",
    "build_on_meta",
    "count_params",
    "flops_per_token",
    "preset_args",
]
