"""``ladder-train --dry-run``: the mesh, the sharded model and a per-GPU memory estimate, without training.

It builds the real mesh and applies the real ``parallelize`` to a model on the meta device, inside a
fake process group of the simulated world size, so the Slurm scripts can be checked on a laptop.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..config import Config, ConfigError, model_args
from ..model import build_on_meta, count_params
from ..parallel import BatchSplit, build_mesh, parallelize, resolve_degrees, resolve_dtype

GIB = 2**30


def activation_bytes(cfg: Config, micro_batch: int) -> dict[str, float]:
    """Activation memory of one micro-batch on one GPU, bf16, after Korthikanti et al. 2022 (eq. 2, with
    flash attention so no s^2 term): 34·s·b·h bytes per layer; with full checkpointing only each block's
    input (2·s·b·h) is kept plus one block's full set. Logits and their gradient are fp32 (8 bytes)."""
    m = cfg.model
    s, b, h, layers = cfg.data.seq_len, micro_batch, m.dim, m.n_layers
    per_layer = 34 * s * b * h
    mode = cfg.parallel.activation_checkpoint
    checkpointed = 0 if mode == "none" else layers if mode == "full" else len(range(0, layers, cfg.parallel.ac_every))
    blocks = (layers - checkpointed) * per_layer + checkpointed * 2 * s * b * h + (per_layer if checkpointed else 0)
    logits = 8 * s * b * m.vocab_size
    return {"blocks": blocks, "logits": logits}


def _simulated_world(simulate: str | None) -> tuple[int, int]:
    if simulate is None:
        nodes = int(os.environ.get("SLURM_NNODES", 1))
        return nodes, int(os.environ.get("GPUS_PER_NODE", 8))
    try:
        nodes, gpus = (int(x) for x in simulate.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--simulate {simulate!r} must look like NODESxGPUS, e.g. 16x8") from None
    return nodes, gpus


def dry_run(cfg: Config, simulate: str | None) -> str:
    """The plan as printable text."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    nodes, gpus = _simulated_world(simulate)
    world = nodes * gpus
    replicate, shard = resolve_degrees(cfg.parallel, world, gpus)
    batch = BatchSplit(cfg.train.global_batch_size, cfg.train.micro_batch_size, world, cfg.data.seq_len)
    batch.check()
    args = model_args(cfg.model)
    counts = count_params(args)

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = build_mesh("cpu", replicate, shard)
        model = build_on_meta(args)
        parallelize(model, cfg.parallel.__class__(**{**cfg.parallel.__dict__, "compile": False}), mesh, torch.bfloat16)
        local_params = sum(p.to_local().numel() for p in model.parameters())
        mesh_shape = tuple(mesh.shape)
    finally:
        dist.destroy_process_group()

    dtype_bytes = 2 if resolve_dtype(cfg.train.dtype, torch.device("cuda")) == torch.bfloat16 else 4
    states = 16 * local_params  # fp32 weights, fp32 gradients, Adam's two moments, all sharded
    block_params = (counts["non_embedding"] - args.dim) / args.n_layers
    # unsharded compute copies in flight: the current and the prefetched block, and the root's embedding
    gathered = dtype_bytes * (2 * block_params + counts["embedding"])
    acts = activation_bytes(cfg, batch.micro_batch)
    total = states + gathered + acts["blocks"] + acts["logits"]
    lines = [
        f"dry run: {cfg.run.name} | {nodes} nodes x {gpus} GPUs = {world} processes",
        f"mesh {mesh_shape} (dp_replicate, dp_shard): {'HSDP' if replicate > 1 and shard > 1 else 'FSDP' if replicate == 1 else 'DP'}",
        f"model {args.residual} ({args.n_layers} layers, dim {args.dim}): {counts['total']:,} parameters, "
        f"{local_params:,} per GPU",
        f"global batch {batch.global_batch} x {batch.seq_len} tokens = {batch.tokens_per_step:,} tokens/step: "
        f"{world} ranks x {batch.accumulation} micro-batches x {batch.micro_batch}",
        f"memory per GPU (GiB): params+grads+adam {states / GIB:.2f} (16 B x {local_params:,}) | "
        f"gathered params {gathered / GIB:.2f} | activations {acts['blocks'] / GIB:.2f} "
        f"(checkpointing: {cfg.parallel.activation_checkpoint}) | logits {acts['logits'] / GIB:.2f} | total {total / GIB:.2f}",
    ]
    return "\n".join(lines)
