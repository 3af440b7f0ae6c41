"""``ladder-train --dry-run``: the mesh, the sharded model and a per-GPU memory estimate, without training.

It builds the real mesh and applies the real ``parallelize`` to a model on the meta device, inside a
fake process group of the simulated world size, so the Slurm scripts can be checked on a laptop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU of a training step: sharded states, gathered compute copies, activations, logits; and what
    keeping every block's parameters gathered with unsharded gradients over the micro-batches adds."""

    states: float
    gathered: float
    activations: float
    logits: float
    unsharded_extra: float

    @property
    def sharded(self) -> float:
        return self.states + self.gathered + self.activations + self.logits

    @property
    def unsharded(self) -> float:
        return self.sharded + self.unsharded_extra


def memory_plan(cfg: Config, args, local_params: int, micro_batch: int, device: torch.device) -> MemoryPlan:
    counts = count_params(args)
    dtype_bytes = 2 if resolve_dtype(cfg.train.dtype, device) == torch.bfloat16 else 4
    block_params = (counts["non_embedding"] - args.dim) / args.n_layers
    acts = activation_bytes(cfg, micro_batch)
    return MemoryPlan(
        states=16 * local_params,  # fp32 weights, fp32 gradients, Adam's two moments, all sharded
        # unsharded compute copies in flight: the current and the prefetched block, and the root's embedding
        gathered=dtype_bytes * (2 * block_params + counts["embedding"]),
        activations=acts["blocks"],
        logits=acts["logits"],
        # every block gathered at once in the compute dtype, and its unsharded gradient accumulated in fp32
        # (FSDP2 accumulates in reduce_dtype while gradient sync is off)
        unsharded_extra=dtype_bytes * (counts["total"] - 2 * block_params - counts["embedding"]) + 4 * counts["total"],
    )


def choose_accumulation(setting: str, plan: MemoryPlan, device: torch.device) -> tuple[str, str]:
    """(``unsharded`` or ``sharded``, why). ``auto``: unsharded when the plan's total with it fits 90 % of the
    device's memory (the CPU's host memory is not planned: unsharded). Even with one micro-batch per step,
    unsharded saves the backward's second all-gather of every block."""
    if setting != "auto":
        return setting, f"parallel.accumulate={setting}"
    if device.type != "cuda":
        return "unsharded", "auto, on the CPU"
    capacity = torch.cuda.get_device_properties(device).total_memory
    fits = plan.unsharded <= 0.9 * capacity
    verdict = "fits" if fits else "does not fit"
    return ("unsharded" if fits else "sharded"), (
        f"auto: the plan with unsharded accumulation, {plan.unsharded / GIB:.1f} GiB, {verdict} 90 % of the "
        f"device's {capacity / GIB:.1f} GiB"
    )


def _simulated_world(simulate: str | None) -> tuple[int, int]:
    if simulate is None:
        nodes = int(os.environ.get("SLURM_NNODES", 1))
        return nodes, int(os.environ.get("GPUS_PER_NODE", 8))
    try:
        nodes, gpus = (int(x) for x in simulate.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--simulate {simulate!r} must look like NODESxGPUS, e.g. 16x8") from None
    return nodes, gpus


def largest_fitting_micro_batch(
    cfg: Config, args, local_params: int, per_rank: int, capacity: float, unsharded: bool
) -> tuple[int, MemoryPlan] | None:
    """The largest micro-batch (a divisor of the sequences per rank) whose plan fits 90 % of ``capacity`` bytes."""
    best = None
    for micro in (m for m in range(1, per_rank + 1) if per_rank % m == 0):
        plan = memory_plan(cfg, args, local_params, micro, torch.device("cuda"))
        if (plan.unsharded if unsharded else plan.sharded) <= 0.9 * capacity:
            best = (micro, plan)
    return best


def dry_run(cfg: Config, simulate: str | None, gpu_memory: float = 80 * GIB) -> str:
    """The plan as printable text, with the largest micro-batch that fits ``gpu_memory`` bytes."""
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

    plan = memory_plan(cfg, args, local_params, batch.micro_batch, torch.device("cuda"))
    lines = [
        f"dry run: {cfg.run.name} | {nodes} nodes x {gpus} GPUs = {world} processes",
        f"mesh {mesh_shape} (dp_replicate, dp_shard): {'HSDP' if replicate > 1 and shard > 1 else 'FSDP' if replicate == 1 else 'DP'}",
        f"model {args.residual} ({args.n_layers} layers, dim {args.dim}): {counts['total']:,} parameters, "
        f"{local_params:,} per GPU",
        f"global batch {batch.global_batch} x {batch.seq_len} tokens = {batch.tokens_per_step:,} tokens/step: "
        f"{world} ranks x {batch.accumulation} micro-batches x {batch.micro_batch}",
        f"memory per GPU (GiB): params+grads+adam {plan.states / GIB:.2f} (16 B x {local_params:,}) | "
        f"gathered params {plan.gathered / GIB:.2f} | activations {plan.activations / GIB:.2f} "
        f"(checkpointing: {cfg.parallel.activation_checkpoint}) | logits {plan.logits / GIB:.2f} | total "
        f"{plan.sharded / GIB:.2f}",
        f"gradient accumulation over {batch.accumulation} micro-batches: unsharded (one gather and one reduction "
        f"per step) adds {plan.unsharded_extra / GIB:.2f} GiB, total {plan.unsharded / GIB:.2f} "
        f"(parallel.accumulate={cfg.parallel.accumulate}; auto keeps it where the device holds the total)",
    ]
    for unsharded in (True, False):
        fitting = largest_fitting_micro_batch(cfg, args, local_params, batch.per_rank, gpu_memory, unsharded)
        mode = "unsharded" if unsharded else "sharded"
        if fitting is None:
            lines.append(f"on a {gpu_memory / GIB:g} GiB GPU, {mode}: no micro-batch fits 90 % of it")
        else:
            micro, fit = fitting
            total = fit.unsharded if unsharded else fit.sharded
            lines.append(
                f"on a {gpu_memory / GIB:g} GiB GPU, {mode}: the largest micro-batch that fits 90 % of it is {micro} "
                f"(plan {total / GIB:.2f} GiB)"
            )
    return "\n".join(lines)
