"""The forward and backward of a step's micro-batches, their gradients accumulated: the loop the trainer runs each
step, and what tests/test_train_host_work.py holds (the ops it dispatches, no host sync inside it)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..data.protocol import Batch
from ..parallel import MicroBatchPlan


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
