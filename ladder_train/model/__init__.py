"""The model: one Transformer definition (training and inference), presets and the export format."""

from .desync import LAYER_REDUCES
from .hf_format import INDEX_FILE, WEIGHTS_FILE
from .modules import IGNORE_INDEX, NO_COMM, Communicator, TokenLoss
from .presets import PRESETS, preset_args
from .transformer import (
    PAPER_LAYOUTS,
    RESIDUAL_LAYOUTS,
    ModelArgs,
    Transformer,
    build_on_meta,
    count_params,
    flops_per_token,
)

__all__ = [
    "IGNORE_INDEX",
    "INDEX_FILE",
    "LAYER_REDUCES",
    "NO_COMM",
    "PAPER_LAYOUTS",
    "PRESETS",
    "RESIDUAL_LAYOUTS",
    "Communicator",
    "ModelArgs",
    "TokenLoss",
    "Transformer",
    "WEIGHTS_FILE",
    "build_on_meta",
    "count_params",
    "flops_per_token",
    "preset_args",
]
