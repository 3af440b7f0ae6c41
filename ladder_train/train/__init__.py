"""The pretraining loop, optimizer and schedule, metrics, and the dry-run planner."""

from .trainer import NonFiniteLossError, Trainer, main

__all__ = ["NonFiniteLossError", "Trainer", "main"]
