"""One optimizer step's parts, which ``Trainer.train_step`` runs in this order: the forward and backward of the
step's micro-batches, their gradients accumulated (``accumulate_gradients``: tests/test_train_host_work.py holds the ops
it dispatches, and no host sync inside it); and the clip and the step's global loss and gradient norm
(``clip_and_reduce``). The verdict on those numbers before ``optimizer.step()`` is ``stability.StabilityGuard``'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..data.protocol import Batch
from ..parallel import MicroBatchPlan
from .stability import Verdict


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step gives the loop: the global numbers and the guard's verdict on them."""

    loss: float  # the mean token loss over the global batch
    grad_norm: float
    data_wait_s: float  # this rank's wait for its micro-batches
    verdict: Verdict


# -- the micro-batches and the global numbers --------------------------------------------------------------------------


def micro_batch_loss(
    model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, divisor: float
) -> torch.Tensor:
    """The micro-batch's summed token loss / ``divisor``, computed inside the model (model.TokenLoss): no logits
    tensor comes out to be held through the backward, and a compiled model keeps only the bf16 logits for it."""
    return model(inputs, labels=labels) / divisor


def accumulate_gradients(
    model: torch.nn.Module,
    next_batch: Callable[[], Batch],
    accumulation: int,
    divisor: float,
    device: torch.device,
    plan: MicroBatchPlan | None = None,
) -> tuple[torch.Tensor, float]:
    """Forward and backward of ``accumulation`` micro-batches from ``next_batch``; returns their summed loss, on the
    device (read once per step, by the caller), and the wait for the data. ``plan`` (what ``parallelize`` returned)
    sets FSDP's switches before each micro-batch; None: a model without FSDP."""
    loss_sum = torch.zeros((), device=device)
    data_wait = 0.0
    for micro in range(accumulation):
        if plan is not None:
            plan.before(micro, accumulation)
        waited = time.perf_counter()
        inputs, labels = next_batch()
        data_wait += time.perf_counter() - waited
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loss = micro_batch_loss(model, inputs, labels, divisor)
        loss.backward()
        loss_sum += loss.detach()
    return loss_sum, data_wait


def clip_and_reduce(
    model: torch.nn.Module, grad_clip: float, loss_sum: torch.Tensor, stop_asked: bool, world_size: int
) -> tuple[float, float, bool]:
    """Clip the gradients to ``grad_clip`` (0: no clipping); the global loss, the gradient norm and whether any rank
    was asked to stop, the same on every rank. One small all-reduce per step carries the summed loss and the stop."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf, foreach=True)
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    shared = torch.stack([loss_sum, torch.tensor(1.0 if stop_asked else 0.0, device=loss_sum.device)])
    dist.all_reduce(shared)
    return shared[0].item() / world_size, grad_norm.item(), shared[1].item() > 0
