"""The all-reduce of a served module: vLLM's own for the layouts that add each output at once, and for the ladder
the issue / wait split vLLM's all-reduce lacks.

vLLM's ``tensor_model_parallel_all_reduce`` returns the full sum (its custom all-reduce, pynccl or, on the CPU, its
shared-memory or gloo path); nothing can run between its issue and its wait. The ladder's overlap needs that gap, so
its modules go through ladder-train's own ``TPCommunicator`` on vLLM's TP process group: functional collectives,
the same ops eagerly and under ``torch.compile``, issued where the module's partial output exists and waited where
the ladder adds it, one module later; ``fence`` pins that order under inductor (docs/design.md, "Serving with vLLM:
the overlap").
"""

from __future__ import annotations

import torch

from ..inference import TPCommunicator
from ..model import Communicator


class VllmSyncCommunicator(Communicator):
    """vLLM's all-reduce, waited at once (standard, parallel, desync, and the ladder with the overlap off)."""

    def __init__(self):
        from vllm.distributed import get_tensor_model_parallel_world_size

        self.tp_degree = get_tensor_model_parallel_world_size()

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_degree == 1:
            return x
        from vllm.distributed import tensor_model_parallel_all_reduce

        return tensor_model_parallel_all_reduce(x)

    def wait(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def fence(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tensors


def held_communicator() -> Communicator:
    """The ladder's communicator: issue now, wait one module later, on vLLM's TP group (TP 1: nothing to reduce)."""
    from vllm.distributed import get_tensor_model_parallel_world_size, get_tp_group

    if get_tensor_model_parallel_world_size() == 1:
        return VllmSyncCommunicator()
    return TPCommunicator("async", get_tp_group().device_group)


def communicators(overlap: bool) -> dict[str, Communicator]:
    """Layer layout -> its communicator: the ladder's held one when ``overlap``, vLLM's all-reduce otherwise."""
    sync = VllmSyncCommunicator()
    return {"standard": sync, "parallel": sync, "desync": sync, "ladder": held_communicator() if overlap else sync}
