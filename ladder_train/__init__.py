"""ladder-train: pretraining and tensor-parallel inference for standard, parallel-attention and Ladder
Residual transformers (Zhang, Mishra et al., ICML 2025, arXiv 2501.06589)."""

from __future__ import annotations

from pathlib import Path

import torch

__version__ = "0.1.0"


def load_model(path_or_preset: str | Path, device: str | torch.device = "cpu", **overrides):
    """A Transformer from an export folder (``model.safetensors`` + ``config.json``), a training
    checkpoint (``RUN_DIR/checkpoints/step-N``) or a preset name (random weights, seeded by the caller). ``overrides`` set ModelArgs fields of a preset, e.g.
    ``residual="ladder"``."""
    from .model import Transformer, preset_args
    from .model.hf_format import load_export
    from .model.presets import PRESETS

    if str(path_or_preset) in PRESETS:
        args = preset_args(str(path_or_preset), **overrides)
        with torch.device(device):
            return Transformer(args)
    path = Path(path_or_preset)
    if path.is_dir():
        if overrides:
            raise ValueError(f"{path}: field overrides apply to presets only, not to saved models")
        if (path / "config.json").is_file():
            return load_export(path, device=device)
        from .checkpoint import model_from_checkpoint

        return model_from_checkpoint(path, device=device)
    raise ValueError(f"{path_or_preset!r} is neither a model preset ({', '.join(PRESETS)}) nor a saved model folder")


__all__ = ["__version__", "load_model"]
