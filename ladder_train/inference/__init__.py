"""Tensor-parallel inference: sharded loading, the all-reduce hook, generation and the speed benchmark."""

from ..loading import load_tp_model
from ..model.tp_plan import check_tp_degree
from .generate import Generator, sample
from .tp import TPCommunicator, comm_mode_for

__all__ = ["Generator", "TPCommunicator", "check_tp_degree", "comm_mode_for", "load_tp_model", "sample"]
