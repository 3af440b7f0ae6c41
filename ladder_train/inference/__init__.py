"""Tensor-parallel inference: sharded loading, the all-reduce hook, generation and the speed benchmark."""

from ..loading import load_tp_model
from ..model.tp_plan import check_tp_degree
from .tp import TPCommunicator, comm_mode_for

__all__ = ["Generator", "TPCommunicator", "check_tp_degree", "comm_mode_for", "load_tp_model", "sample"]


def __getattr__(name: str):
    # generate.py is imported on first use, not with the package: ``python -m ladder_train.inference.generate``
    # (ladder-generate under torchrun) would otherwise find it imported already and warn
    if name in ("Generator", "sample"):
        from . import generate

        return getattr(generate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
