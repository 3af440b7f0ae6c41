"""ladder-train: pretraining and tensor-parallel inference for standard, parallel-attention and Ladder
Residual transformers (Zhang, Mishra et al., ICML 2025, arXiv 2501.06589).

``ladder_train.load_model(SOURCE)``: a model from a preset name, an export folder or a training checkpoint
(see ``loading``)."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    # imported on first use, so that `import ladder_train.config` (every CLI) does not pull in torch's
    # checkpoint stack
    if name == "load_model":
        from .loading import load_model

        return load_model
    raise AttributeError(f"module 'ladder_train' has no attribute {name!r}")


__all__ = ["__version__", "load_model"]
