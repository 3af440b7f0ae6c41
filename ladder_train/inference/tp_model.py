"""A tensor-parallel rank's model, ready to run: its shard (``loading.load_tp_shard``) with the communicator that
turns each module's partial output into the full sum installed, so no caller can run a shard that silently
computes partial sums."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from ..loading import load_tp_shard
from ..model import Communicator, Transformer
from .tp import TPCommunicator, comm_mode_for


def load_tp_model(
    source: str | Path,
    tp_rank: int = 0,
    tp_size: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    group: dist.ProcessGroup | None = None,
    comm: Communicator | None = None,
    **overrides,
) -> Transformer:
    """This rank's shard of ``source`` (an export, a training checkpoint, or a preset with ``overrides``), in eval
    mode. At TP > 1 with ``comm`` installed, else the layout's all-reduce over ``group`` (default: the world),
    asynchronous for the ladder so it overlaps the next module. At TP 1 no communicator is needed."""
    model = load_tp_shard(source, tp_rank, tp_size, device, dtype, seed, group, **overrides)
    if tp_size > 1:
        model.set_communicator(comm if comm is not None else TPCommunicator(comm_mode_for(model.args.residual), group))
    return model
