"""Process group and device mesh: one process or many (torchrun/srun), HSDP, FSDP or plain data parallel; and
how the global batch splits over the data-parallel ranks (``BatchSplit``), which the trainer and the dry run share."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..config import ConfigError, ParallelConfig
from ..errors import InputError, RunFailed
from ..lifetime import end_with_parent

_timeout: timedelta | None = None  # the default group's timeout, given to the mesh's subgroups too


@dataclass
class RankEnv:
    """Where this process sits: its rank, the world, and its device."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port free on this host now, for a rendezvous of processes started here."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(
    timeout_s: float | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    cpu: bool = False,
    group_of_one: bool = True,
) -> RankEnv:
    """Join the process group torchrun set up, or make a group of one, so a single process runs the
    same sharded code path. NCCL with one GPU per process when CUDA is available, gloo on the CPU.
    The one place a process group is created (train/memory_plan.py's fake dry-run group aside).

    ``timeout_s`` (``parallel.timeout_s``; None = its default) bounds the rendezvous and every collective
    of the default group, stated rather than left to the backend's default (10 min for NCCL).
    ``rank`` and ``world_size``: the place a launcher gave this process (MASTER_ADDR and MASTER_PORT in the
    environment) instead of torchrun's variables. ``cpu``: gloo on the CPU even where CUDA is available.
    ``group_of_one=False``: a single process creates no group and leaves the environment alone (inference
    without tensor parallelism runs no collective)."""
    global _timeout
    if timeout_s is None:
        timeout_s = ParallelConfig.timeout_s
    _timeout = timedelta(seconds=timeout_s)
    if rank is not None:
        world_size = world_size or 1
        local_rank, local_world_size = rank, world_size
    else:
        if "RANK" not in os.environ and group_of_one:
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun rank: SIGTERM (save and stop) if torchrun dies
        end_with_parent(os.getppid(), signal.SIGTERM)
    if torch.cuda.is_available() and not cpu:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized() and (group_of_one or world_size > 1):
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            device_id=device if backend == "nccl" else None,
            timeout=_timeout,
        )
    return RankEnv(rank, world_size, local_rank, local_world_size, device)


def together(action: Callable[[], object], group=None) -> None:
    """``action()`` on every rank of ``group`` (default: all), then every rank learns whether it failed on any: where
    it did, every rank raises, the rank that failed its own error and the others the same line, ``quiet``
    (``run_command`` prints it once), so that none is left waiting in a later collective for a rank that is gone.
    For what one rank does alone between collectives (rank 0's files in a shared folder): ``action`` ends its own
    collectives before any step that may fail on one rank only. Every rank waits for every other: a barrier too."""
    failure = None
    try:
        action()
    except Exception as err:
        failure = err
    mine = None if failure is None else (isinstance(failure, InputError), _one_line(failure))
    verdicts = [mine]
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        verdicts = [None] * dist.get_world_size(group)
        dist.all_gather_object(verdicts, mine, group=group)
    if failure is not None:
        raise failure
    for rank, verdict in enumerate(verdicts):
        if verdict is not None:
            bad_input, message = verdict
            error = InputError(message) if bad_input else RunFailed(f"rank {rank} failed: {message}")
            error.quiet = True
            raise error


def _one_line(err: Exception) -> str:
    text = str(err).strip()
    if isinstance(err, InputError):
        return text
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def resolve_degrees(cfg: ParallelConfig, world_size: int, local_world_size: int) -> tuple[int, int]:
    """(dp_replicate, dp_shard) from the config; -1 means: shard over a node, replicate across nodes."""
    shard, replicate = cfg.dp_shard, cfg.dp_replicate
    if shard == -1:
        shard = world_size // replicate if replicate > 0 else local_world_size
    if replicate == -1:
        replicate = world_size // shard if shard > 0 else 1
    if shard <= 0 or replicate <= 0 or shard * replicate != world_size:
        raise ConfigError(
            f"keys 'parallel.dp_replicate'={cfg.dp_replicate} x 'parallel.dp_shard'={cfg.dp_shard} resolve to "
            f"{replicate} x {shard}, which does not equal the world size {world_size}"
        )
    return replicate, shard


def build_mesh(device_type: str, replicate: int, shard: int) -> DeviceMesh:
    """A 2-D mesh (dp_replicate, dp_shard). fully_shard on it is HSDP; a degree of 1 makes it FSDP
    (replicate = 1) or plain data parallel (shard = 1), with the same code."""
    names = ("dp_replicate", "dp_shard")
    override = None
    backend = dist.get_backend()
    # subgroups would otherwise get the backend's default timeout, not parallel.timeout_s (the dry run's fake
    # group has no timeout to pass on)
    if _timeout is not None and backend in ("nccl", "gloo"):
        options = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
        options._timeout = _timeout
        override = {name: (backend, options) for name in names}
    return init_device_mesh(device_type, (replicate, shard), mesh_dim_names=names, backend_override=override)


@dataclass
class BatchSplit:
    """How the global batch splits: over data-parallel ranks, then into micro-batches."""

    global_batch: int
    micro_batch: int
    dp_world: int
    seq_len: int

    @property
    def per_rank(self) -> int:
        return self.global_batch // self.dp_world

    @property
    def accumulation(self) -> int:
        return self.per_rank // self.micro_batch

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def check(self) -> None:
        if self.global_batch % (self.micro_batch * self.dp_world):
            raise ConfigError(
                f"key 'train.global_batch_size'={self.global_batch} is not a multiple of "
                f"train.micro_batch_size={self.micro_batch} x {self.dp_world} data-parallel ranks"
            )
