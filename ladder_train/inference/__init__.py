"""Tensor-parallel inference: a rank's ready model (``tp_model``), the all-reduce hook (``tp``) and generation
(``generate``).
``python -m ladder_train.inference`` is ``ladder-generate``."""

from ..model.tp_sharding import check_tp_degree
from .generate import Generator, next_tokens
from .tp import TPCommunicator, comm_mode_for
from .tp_model import load_tp_model

__all__ = ["Generator", "TPCommunicator", "check_tp_degree", "comm_mode_for", "load_tp_model", "next_tokens"]
