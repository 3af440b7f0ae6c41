"""Tensor-parallel inference: sharded loading, the all-reduce hook, generation and the speed benchmark."""

from .generate import Generator, sample
from .tp import TPCommunicator, check_tp_degree, comm_mode_for, load_tp_model

__all__ = ["Generator", "TPCommunicator", "check_tp_degree", "comm_mode_for", "load_tp_model", "sample"]
