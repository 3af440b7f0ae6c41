"""The pretraining loop, optimizer and schedule, metrics, the evaluator, and the dry-run planner. The
command line is ``ladder_train.cli``."""

from .stability import LossSpikeStop, NonFiniteLossError
from .trainer import Trainer

__all__ = ["LossSpikeStop", "NonFiniteLossError", "Trainer"]
