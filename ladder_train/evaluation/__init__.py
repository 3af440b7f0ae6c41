"""Evaluation: the lm-eval adapter over the project's model, offline task YAMLs, the eval-after-train entry
point and held-out perplexity.

    from ladder_train.evaluation import LadderLM, evaluate, validation_loss, wandb_summary
"""

from .adapter import EvalError, LadderLM
from .harness import evaluate
from .perplexity import held_out_batches, perplexity, scored_loss_sum, validation_loss
from .results import format_table, wandb_summary
from .task_registry import LOCAL_TASKS, PAPER_TASKS

__all__ = [
    "LOCAL_TASKS",
    "PAPER_TASKS",
    "EvalError",
    "LadderLM",
    "evaluate",
    "format_table",
    "held_out_batches",
    "perplexity",
    "scored_loss_sum",
    "validation_loss",
    "wandb_summary",
]
