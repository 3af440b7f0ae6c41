"""Tensor parallelism for inference: the reduce hook. The sharding plan is model/tp_sharding.py; each rank loads
only its shard through ``inference.load_tp_model``, which installs this hook.

The reduce hook, :class:`TPCommunicator`, turns those partial sums into full sums through functional
collectives (``torch.ops._c10d_functional.all_reduce`` / ``wait_tensor``). We use them rather than
``dist.all_reduce(async_op=True)`` work handles because they are the same ops eagerly and under
``torch.compile``: a traced graph keeps each all-reduce where the module finishes and its wait where the
output joins the stream, and NCCL collectives inside that graph can be captured by CUDA graphs, while
Python work handles cannot. Eagerly (the CPU path) they are plain async collectives: the issue returns at
once, the wait blocks until the sum has arrived.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..model import Communicator

COMM_MODES = ("sync", "async", "none")


@torch.library.custom_op("ladder_train::fence", mutates_args=())
def _fence(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors``, produced together by one op that inductor cannot see into, fuse or split."""
    return [t.clone() for t in tensors]


@_fence.register_fake
def _(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in tensors]


def comm_mode_for(residual: str) -> str:
    """Standard, parallel and desync add each output at once (sync); the ladder waits one module later (async)."""
    return "async" if residual == "ladder" else "sync"


class TPCommunicator(Communicator):
    """All-reduces a module's partial output over the TP group.

    ``mode``: ``sync`` reduces in ``reduce`` and returns the full sum; ``async`` issues the all-reduce and
    returns a pending tensor that ``wait`` completes (the ladder calls ``wait`` one module later); ``none``
    skips every all-reduce (numerically wrong on purpose: the no-communication ceiling).

    Only functional collectives and no host-side work, so ``torch.compile(fullgraph=True)`` traces it."""

    def __init__(self, mode: str, group: dist.ProcessGroup | None = None):
        if mode not in COMM_MODES:
            raise ValueError(f"comm mode must be one of {', '.join(COMM_MODES)}, got {mode!r}")
        self.mode = mode
        self.tp_degree = dist.get_world_size(group)
        # the name, not the group object: a plain string is what the traced collective takes
        self.group_name = (group or dist.group.WORLD).group_name

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "none":
            return x
        pending = torch.ops._c10d_functional.all_reduce(x, "sum", self.group_name)
        return self.wait_done(pending) if self.mode == "sync" else pending

    def wait(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode != "async":  # sync: ``reduce`` already returned the full sum; none: nothing to wait for
            return x
        return self.wait_done(x)

    def wait_done(self, pending: torch.Tensor) -> torch.Tensor:
        return torch.ops._c10d_functional.wait_tensor(pending)

    def fence(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Compiled, inductor would otherwise fuse the ladder's residual adds (and norms) across modules and
        # hoist them, with their waits, ahead of the compute that should hide the pending all-reduce; or
        # hoist a later module ahead of an earlier all-reduce. The opaque op pins the order at the cost of
        # a copy of the stream and of the module output. Eager code runs in program order: no copy there.
        if self.mode == "async" and torch.compiler.is_compiling():
            return tuple(torch.ops.ladder_train.fence(list(tensors)))
        return tensors


class EmulatedLinkCommunicator(TPCommunicator):
    """A TP communicator whose all-reduces travel over an emulated slow link, for CPU benchmarks.

    The link is one serialised channel, as one NCCL stream per communicator is on a GPU: an all-reduce
    issued at time t starts at max(t, end of the previous all-reduce) and occupies the link for
    ``latency_ms + bytes / bandwidth``. Its wait returns no earlier than that end, sleeping (not spinning,
    so no CPU core is taken) for whatever the real gloo all-reduce did not already take. So two in-flight
    all-reduces queue behind each other instead of overlapping their delays. Host timers and sleeps: eager
    runs only (the benchmark refuses ``--compile on`` with it)."""

    def __init__(
        self,
        mode: str,
        group: dist.ProcessGroup | None = None,
        latency_ms: float = 0.0,
        bandwidth_gbs: float | None = None,
    ):
        super().__init__(mode, group)
        self.latency_s = latency_ms / 1e3
        self.bytes_per_s = None if bandwidth_gbs is None else bandwidth_gbs * 1e9
        self.link_free_at = 0.0  # perf_counter time at which the link's last all-reduce ends
        self._ends_at: dict[int, float] = {}  # id(pending tensor) -> emulated end of its all-reduce

    def transfer_s(self, x: torch.Tensor) -> float:
        """How long one all-reduce of ``x`` occupies the link."""
        size = x.numel() * x.element_size()
        return self.latency_s + (size / self.bytes_per_s if self.bytes_per_s else 0.0)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "none":
            return x
        pending = torch.ops._c10d_functional.all_reduce(x, "sum", self.group_name)
        start = max(time.perf_counter(), self.link_free_at)
        self.link_free_at = start + self.transfer_s(x)
        self._ends_at[id(pending)] = self.link_free_at
        return self.wait_done(pending) if self.mode == "sync" else pending

    def wait_done(self, pending: torch.Tensor) -> torch.Tensor:
        reduced = torch.ops._c10d_functional.wait_tensor(pending)
        remaining = self._ends_at.pop(id(pending)) - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return reduced


def make_communicator(
    mode: str,
    group: dist.ProcessGroup | None = None,
    link_latency_ms: float = 0.0,
    link_bandwidth_gbs: float | None = None,
) -> TPCommunicator:
    """The real link, or the emulated serialised one when a latency or bandwidth is given."""
    if link_latency_ms or link_bandwidth_gbs:
        return EmulatedLinkCommunicator(mode, group, link_latency_ms, link_bandwidth_gbs)
    return TPCommunicator(mode, group)
