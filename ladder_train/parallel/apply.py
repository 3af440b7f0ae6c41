"""Parallelisms as plain functions, applied in a fixed order: activation checkpointing, then
torch.compile, then fully_shard (each block, then the root)."""

from __future__ import annotations

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ..config import ParallelConfig
from ..model import Transformer


def apply_activation_checkpointing(model: Transformer, mode: str, every: int) -> None:
    """Recompute block activations in backward: every block (full) or every ``every``-th (every_n)."""
    if mode == "none":
        return
    for i, block in enumerate(model.layers):
        if mode == "full" or i % every == 0:
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: Transformer) -> None:
    """Compile each block on its own: the blocks are identical, so one compiled graph is reused."""
    for block in model.layers:
        block.compile()


def apply_fsdp(model: Transformer, mesh: DeviceMesh, param_dtype: torch.dtype) -> None:
    """Shard every block, then the root (embeddings, final norm). bf16 compute keeps fp32 master
    weights and reduces gradients in fp32. The last block stays unsharded after forward, as backward
    needs it first."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    last = len(model.layers) - 1
    for i, block in enumerate(model.layers):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < last)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True)


def parallelize(model: Transformer, cfg: ParallelConfig, mesh: DeviceMesh, param_dtype: torch.dtype) -> Transformer:
    apply_activation_checkpointing(model, cfg.activation_checkpoint, cfg.ac_every)
    if cfg.compile:
        apply_compile(model)
    # one fp32 process has nothing to shard, reduce or cast: FSDP would only add copies per step
    if mesh.size() > 1 or param_dtype != torch.float32:
        apply_fsdp(model, mesh, param_dtype)
    return model
