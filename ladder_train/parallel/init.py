"""Initialising a sharded model so that its weights do not depend on how it is sharded."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from ..model import Transformer


@torch.no_grad()
def init_sharded_weights(model: Transformer, seed: int) -> None:
    """Draw every parameter in full from one seeded generator (the same on every rank, in
    named_parameters order) and keep this rank's shard. So 1, 2 or 4 processes, FSDP or HSDP, start
    from bit-identical weights; the transient full tensor is one parameter at a time."""
    model.init_rope()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        full = torch.empty(param.shape, dtype=param.dtype, device=device)
        std = model.init_std(name)
        if std is None:
            full.fill_(1.0)
        else:
            full.normal_(mean=0.0, std=std, generator=generator)
        if isinstance(param, DTensor):
            # every rank holds the same full tensor, so each slices its own shard without communication
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
