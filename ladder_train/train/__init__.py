"""The pretraining loop, optimizer and schedule, metrics, the evaluator, and the dry-run planner. The
command line is ``ladder_train.cli``."""

from .trainer import NonFiniteLossError, Trainer

__all__ = ["NonFiniteLossError", "Trainer"]
