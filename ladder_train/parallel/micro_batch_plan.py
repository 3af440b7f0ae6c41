"""What FSDP does around each micro-batch of an optimizer step, owned by one object: ``parallelize`` decides how the
gradients accumulate (from the memory plan the caller hands it) and returns the plan; the trainer asks it once per
micro-batch (``before(micro, n)``) and nothing else carries the setting."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule

# (fits, why) of keeping the gradients unsharded, given this rank's local parameter count: the memory plan's answer
UnshardedFits = Callable[[int], tuple[bool, str]]


@dataclass(frozen=True)
class MicroBatchPlan:
    """``accumulate``: ``unsharded`` (every block stays gathered over the step, its gradient accumulated unsharded and
    reduced once, by the last micro-batch), ``sharded`` (FSDP's gather and reduce on every micro-batch) or ``none``
    (no FSDP: one fp32 process). ``replicate`` > 1 (HSDP): the replicas all-reduce in the last micro-batch only."""

    model: torch.nn.Module
    accumulate: str
    reason: str
    replicate: int = 1

    def before(self, micro: int, n: int) -> None:
        """Set FSDP's switches for micro-batch ``micro`` of ``n``. Each setter walks every module, so they are set on
        the first micro-batch and the last only, the two where their values change."""
        last = micro == n - 1
        if self.accumulate == "none" or not (micro == 0 or last):
            return
        if self.replicate > 1:
            self.model.set_requires_all_reduce(last)
        if self.accumulate == "unsharded":  # gathered by the first micro-batch, reduced by the last
            self.model.set_requires_gradient_sync(last)
            self.model.set_reshard_after_backward(last)

    def describe(self) -> str | None:
        """The line a run prints about its gradients (benchmarks read it), or None without FSDP."""
        if self.accumulate == "none":
            return None
        once = "one gather and one reduction per step" if self.accumulate == "unsharded" else "per micro-batch"
        return f"FSDP gradients: {self.accumulate} ({once}; {self.reason})"


def plan_micro_batches(
    model: torch.nn.Module, setting: str, replicate: int, fits: UnshardedFits | None
) -> MicroBatchPlan:
    """The plan of a model ``parallelize`` has wrapped. ``setting`` is parallel.accumulate; under ``auto`` the
    gradients stay unsharded where ``fits`` says the plan's total with them fits the device (without ``fits``:
    unsharded, which saves the backward's second all-gather of every block even at one micro-batch per step)."""
    if not isinstance(model, FSDPModule):
        return MicroBatchPlan(model, "none", "not sharded (one fp32 process)", replicate)
    if setting != "auto":
        mode, reason = setting, f"parallel.accumulate={setting}"
    elif fits is None:
        mode, reason = "unsharded", "auto, no memory plan"
    else:
        local_params = sum(p.to_local().numel() for p in model.parameters())
        ok, reason = fits(local_params)
        mode = "unsharded" if ok else "sharded"
    if mode == "unsharded":
        model.set_reshard_after_forward(False)  # the backward and the next micro-batch reuse the gather
    return MicroBatchPlan(model, mode, reason, replicate)
