"""The memory plan: the bytes per GPU of a training step at its peak, counted from the config. Every run asks it
under FSDP (``unsharded_fits``: whether the gradients may stay unsharded over a step's micro-batches), and
``ladder-train --dry-run`` prints it (``plan_summary``: the real mesh and the real ``parallelize`` applied to a model
on the meta device, inside a fake process group of the simulated world size, so the Slurm scripts can be checked on a
laptop; ``dry_run`` its text, ``--dry-run --json`` its figures as one JSON line).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ..config import Config, ConfigError, model_args
from ..model import build_on_meta, count_params
from ..parallel import BatchSplit, build_mesh, parallelize, resolve_degrees, resolve_dtype

GIB = 2**30


def block_bytes_per_token(args, layout: str, compiled: bool, stream_inputs: tuple[bool, bool] = (False, False)) -> int:
    """Bytes one block keeps for its backward per token, bf16, counted from the tensors autograd saves (held against
    autograd's own record by tests/test_memory_plan.py). Eager: each RMSNorm keeps its fp32 input (4h), the normalised
    bf16 value (2h), its output as the next matmul's input (2h) and one fp32 rsqrt; attention keeps q, k, v as the
    kernel sees them (k and v repeated to every head) and its output (2h each) with one fp32 log-sum-exp per head;
    the SwiGLU MLP keeps gate, SiLU(gate), up and their product (2f each). A compiled block (inductor's min-cut
    partitioner) recomputes the norms' fp32 math and the SiLU: it keeps the block's input and each norm's output
    (2h each), q, k, v, the attention output and its reshaped copy (2h each), gate, up and their product (2f each).
    A desync layer emulating t streams keeps the same matmul activations (each stream runs 1/t of the heads and hidden
    units), but a module whose input is still t separate streams (``stream_inputs``: its predecessor did not
    all-reduce; desync_stream_inputs) normalises t copies: t - 1 more of its norm's tensors (eager 8h + 4, compiled
    4h + 4). Above n_kv_heads streams, the KV heads each stream computes for itself are not counted."""
    h, f = args.dim, args.ffn_dim
    norms = 1 if layout == "parallel" else 2
    small = 4 * args.n_heads + 4 * norms  # the log-sum-exp and the rsqrt, fp32
    extra_streams = (args.desync_tp - 1) if layout == "desync" else 0
    copies = extra_streams * sum(stream_inputs)
    if compiled:
        return 2 * h * (1 + norms) + 10 * h + 6 * f + small + copies * (4 * h + 4)
    return norms * 8 * h + 8 * h + 8 * f + small + copies * (8 * h + 4)


def desync_stream_inputs(args) -> list[tuple[bool, bool]]:
    """Per layer: whether its attention's and its MLP's input is still t separate streams (the module before did not
    all-reduce). Standard layers and the first desync module read one stream."""
    inputs, previous_reduced = [], True
    for attention, mlp in args.layer_reduces():
        inputs.append((not previous_reduced, not attention))
        previous_reduced = mlp
    return inputs


def checkpointed_bytes_per_token(args, layout: str, mode: str) -> int:
    """What a checkpointed block keeps per token: its inputs (the ladder's stream and its two pending outputs); under
    ``selective`` also the outputs of the ops SAVED_IN_SELECTIVE names (q, k, v, attention with its log-sum-exp, the
    output projection, gate, up, down)."""
    h, f, kv = args.dim, args.ffn_dim, args.n_kv_heads * args.head_dim
    inputs = 2 * h * (3 if layout == "ladder" else 1)
    if mode != "selective":
        return inputs
    return inputs + 2 * (h + 2 * kv) + 2 * h + 4 * args.n_heads + 2 * h + 4 * f + 2 * h


def activation_bytes(cfg: Config, micro_batch: int) -> dict[str, float]:
    """Activation memory of one micro-batch on one GPU in its backward. ``blocks``: what every block keeps
    (block_bytes_per_token), a checkpointed block only checkpointed_bytes_per_token, and the final norm (eager, as
    in a block). ``logits``: the loss's temporaries at the start of the backward (model.TokenLoss). Eager, 12 bytes
    per token and vocabulary entry, all fp32: the log-softmax output the loss keeps, the gradient of the loss with
    respect to it and the gradient of the logits (the logits themselves are not kept). Compiled, 2 bytes per token
    and vocabulary entry and 8 per token: inductor keeps the bf16 logits and two fp32 statistics per row, and its
    backward writes the logits' gradient over the logits (held against autograd's record and the generated code by
    tests/test_memory_plan.py). ``recompute``: one checkpointed block's full set while it is recomputed, later in
    the backward, once the loss's temporaries are gone."""
    args = model_args(cfg.model)
    tokens = cfg.data.seq_len * micro_batch
    mode, compiled = cfg.parallel.activation_checkpoint, cfg.parallel.compile
    blocks, recompute = 8 * args.dim + 4, 0  # the final norm
    streams = desync_stream_inputs(args)
    for i, layout in enumerate(args.layer_layouts()):
        full = block_bytes_per_token(args, layout, compiled, streams[i])
        checkpointed = mode in ("full", "selective") or (mode == "every_n" and i % cfg.parallel.ac_every == 0)
        blocks += checkpointed_bytes_per_token(args, layout, mode) if checkpointed else full
        recompute = max(recompute, full if checkpointed else 0)
    logits = tokens * (2 * args.vocab_size + 8) if compiled else 12 * tokens * args.vocab_size
    return {"blocks": tokens * blocks, "recompute": tokens * recompute, "logits": logits}


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU of a training step at its peak, the start of a micro-batch's backward: the parts, then the two
    totals. ``sharded``: FSDP gathers and reduces on every micro-batch. ``unsharded``: every block stays gathered
    over the step, its gradient accumulated unsharded in fp32 and reduced once, by the last micro-batch."""

    states: float  # fp32 weights, gradients and Adam's two moments, sharded
    gathered: float
    activations: float
    logits: float
    sharded: float
    unsharded: float

    @property
    def unsharded_extra(self) -> float:
        return self.unsharded - self.sharded


def memory_plan(
    cfg: Config, args, local_params: int, micro_batch: int, device: torch.device, accumulation: int
) -> MemoryPlan:
    """The plan of ``accumulation`` micro-batches of ``micro_batch`` sequences per step. The optimizer step adds
    nothing on a GPU: fused AdamW updates in place (a foreach AdamW would add 4 bytes per local parameter)."""
    counts = count_params(args)
    dtype_bytes = 2 if resolve_dtype(cfg.train.dtype, device) == torch.bfloat16 else 4
    total, local = counts["total"], local_params
    block_params = (counts["non_embedding"] - args.dim) / args.n_layers
    acts = activation_bytes(cfg, micro_batch)
    # unsharded compute copies in flight: the current and the prefetched unit of blocks (units of k consecutive
    # blocks, the last one shorter: two of them hold min(2k, layers)), and the root's embedding
    in_flight = min(2 * cfg.parallel.blocks_per_fsdp_unit, args.n_layers)
    gathered = dtype_bytes * (in_flight * block_params + counts["embedding"])
    in_backward = acts["blocks"] + max(acts["logits"], acts["recompute"])
    # zero_grad(set_to_none) leaves no gradient to the first micro-batch; the later ones find the sharded gradients
    # (HSDP: its partial reductions) of the earlier ones
    weights, earlier = 12 * local, (4 * local if accumulation > 1 else 0)
    sharded = max(weights + earlier + gathered + in_backward, 16 * local)
    # kept unsharded: every block gathered, an fp32 accumulator per gradient from the first micro-batch on; sharded
    # gradients only appear in the last one's reduction, as each block's accumulator goes
    unsharded = max(weights + dtype_bytes * total + (4 * total if accumulation > 1 else 0) + in_backward, 16 * local)
    return MemoryPlan(16 * local, gathered, acts["blocks"], acts["logits"], sharded, unsharded)


def unsharded_fits(cfg: Config, args, batch: BatchSplit, device: torch.device, local_params: int) -> tuple[bool, str]:
    """For parallel.accumulate=auto (``parallelize`` asks it, bound to all but this rank's local parameter count):
    (whether the plan's total with the gradients kept unsharded fits 90 % of the device's memory, why). The CPU's
    host memory is not planned: it fits."""
    if device.type != "cuda":
        return True, "auto, on the CPU"
    capacity = torch.cuda.get_device_properties(device).total_memory
    return plan_fits(cfg, args, batch, capacity, local_params)


def plan_fits(cfg: Config, args, batch: BatchSplit, capacity: float, local_params: int) -> tuple[bool, str]:
    """auto's rule on a device of ``capacity`` bytes: (whether the plan with unsharded accumulation fits 90 % of it,
    why). The run asks it of its own device, the dry run of ``--gpu-memory``."""
    plan = memory_plan(cfg, args, local_params, batch.micro_batch, torch.device("cuda"), batch.accumulation)
    ok = plan.unsharded <= 0.9 * capacity
    return ok, (
        f"auto: the plan with unsharded accumulation, {plan.unsharded / GIB:.1f} GiB, "
        f"{'fits' if ok else 'does not fit'} 90 % of the device's {capacity / GIB:.1f} GiB"
    )


def _simulated_world(simulate: str | None) -> tuple[int, int, str]:
    """(nodes, GPUs per node, where they come from) of ``--simulate NODESxGPUS``, else of SLURM_NNODES and
    GPUS_PER_NODE (1 x 8 where unset)."""
    if simulate is None:
        where = "SLURM_NNODES and GPUS_PER_NODE"
        nodes, gpus = os.environ.get("SLURM_NNODES"), os.environ.get("GPUS_PER_NODE")
        text = f"{nodes or 1}x{gpus or 8}"
        origin = ", ".join(
            f"{k}={v}" if v else f"{k} unset: {d}"
            for k, v, d in (("SLURM_NNODES", nodes, 1), ("GPUS_PER_NODE", gpus, 8))
        )
    else:
        where, text, origin = "--simulate", simulate, f"--simulate {simulate}"
    try:
        nodes, gpus = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"{where} {text!r} must look like NODESxGPUS, e.g. 16x8") from None
    if nodes < 1 or gpus < 1:
        raise ConfigError(f"{where} {text!r}: NODES and GPUS must be integers >= 1, e.g. 16x8")
    return nodes, gpus, origin


def largest_fitting_micro_batch(
    cfg: Config, args, local_params: int, per_rank: int, capacity: float, unsharded: bool
) -> tuple[int, MemoryPlan] | None:
    """The largest micro-batch (a divisor of the sequences per rank) whose plan fits 90 % of ``capacity`` bytes."""
    best = None
    for micro in (m for m in range(1, per_rank + 1) if per_rank % m == 0):
        plan = memory_plan(cfg, args, local_params, micro, torch.device("cuda"), per_rank // micro)
        if (plan.unsharded if unsharded else plan.sharded) <= 0.9 * capacity:
            best = (micro, plan)
    return best


def plan_summary(cfg: Config, simulate: str | None, gpu_memory: float = 80 * GIB) -> dict:
    """The dry run's figures (``ladder-train --dry-run --json`` prints them): the world, mesh, model and batch split,
    the plan's parts and totals in GiB (``memory_gib``: ``sharded`` and ``unsharded`` accumulation), and per
    accumulation the largest micro-batch whose plan fits 90 % of ``gpu_memory`` bytes (None where none fits)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    nodes, gpus, origin = _simulated_world(simulate)
    world = nodes * gpus
    args = model_args(cfg.model)
    try:
        replicate, shard = resolve_degrees(cfg.parallel, world, gpus)
        batch = BatchSplit(cfg.train.global_batch_size, cfg.train.micro_batch_size, world, cfg.data.seq_len)
        batch.check()
    except ConfigError as err:  # the world is the dry run's assumption: say which, and whence
        hint = "" if simulate else "; --simulate NODESxGPUS plans another"
        raise ConfigError(f"{err} (the dry run assumes {nodes} node(s) x {gpus} GPUs: {origin}{hint})") from None

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = build_mesh("cpu", replicate, shard)
        model = build_on_meta(args)
        # the run's own choice for parallel.accumulate, asked of auto's rule on a --gpu-memory device
        fits = functools.partial(plan_fits, cfg, args, batch, gpu_memory)
        _, micro_plan = parallelize(model, replace(cfg.parallel, compile=False), mesh, torch.bfloat16, fits)
        local_params = sum(p.to_local().numel() for p in model.parameters())
        mesh_shape = list(mesh.shape)
    finally:
        dist.destroy_process_group()

    plan = memory_plan(cfg, args, local_params, batch.micro_batch, torch.device("cuda"), batch.accumulation)
    fitting = {}
    for mode in ("unsharded", "sharded"):
        found = largest_fitting_micro_batch(cfg, args, local_params, batch.per_rank, gpu_memory, mode == "unsharded")
        fitting[mode] = found and {"micro_batch": found[0], "total_gib": getattr(found[1], mode) / GIB}
    return {
        "run": cfg.run.name,
        "nodes": nodes,
        "gpus_per_node": gpus,
        "mesh": mesh_shape,
        "sharding": "HSDP" if replicate > 1 and shard > 1 else "FSDP" if replicate == 1 else "DP",
        "layout": args.residual,
        "n_layers": args.n_layers,
        "dim": args.dim,
        "params": count_params(args)["total"],
        "params_per_gpu": local_params,
        "global_batch": batch.global_batch,
        "seq_len": batch.seq_len,
        "tokens_per_step": batch.tokens_per_step,
        "micro_batch": batch.micro_batch,
        "micro_batches": batch.accumulation,
        "activation_checkpoint": cfg.parallel.activation_checkpoint,
        "accumulate": micro_plan.accumulate,  # what the run would choose on a gpu_memory device
        "accumulate_setting": cfg.parallel.accumulate,
        "accumulate_reason": micro_plan.reason,
        "world_from": origin,
        "memory_gib": {key: getattr(plan, key) / GIB for key in PLAN_PARTS},
        "gpu_memory_gib": gpu_memory / GIB,
        "largest_micro_batch": fitting,
    }


PLAN_PARTS = ("states", "gathered", "activations", "logits", "sharded", "unsharded")


def dry_run(cfg: Config, simulate: str | None, gpu_memory: float = 80 * GIB) -> str:
    """The plan as printable text, with the largest micro-batch that fits ``gpu_memory`` bytes."""
    return plan_text(plan_summary(cfg, simulate, gpu_memory))


def _choice(s: dict) -> str:
    """What auto chose for the plan's device, and why; nothing for a setting that chose itself."""
    if s["accumulate_setting"] != "auto":
        return ""
    return (
        f": on a {s['gpu_memory_gib']:g} GiB GPU, {s['accumulate']} ({s['accumulate_reason'].removeprefix('auto: ')})"
    )


def plan_text(s: dict) -> str:
    """``plan_summary``'s figures as ``--dry-run`` prints them."""
    world, gib, n = s["nodes"] * s["gpus_per_node"], s["memory_gib"], s["micro_batches"]
    lines = [
        f"dry run: {s['run']} | {s['nodes']} nodes x {s['gpus_per_node']} GPUs = {world} processes ({s['world_from']})",
        f"mesh {tuple(s['mesh'])} (dp_replicate, dp_shard): {s['sharding']}",
        f"model {s['layout']} ({s['n_layers']} layers, dim {s['dim']}): {s['params']:,} parameters, "
        f"{s['params_per_gpu']:,} per GPU",
        f"global batch {s['global_batch']} x {s['seq_len']} tokens = {s['tokens_per_step']:,} tokens/step: "
        f"{world} ranks x {n} micro-batches x {s['micro_batch']}",
        f"memory per GPU at the step's peak, a backward's start (GiB): params+grads+adam {gib['states']:.2f} "
        f"(16 B x {s['params_per_gpu']:,}) | gathered params {gib['gathered']:.2f} | activations "
        f"{gib['activations']:.2f} (checkpointing: {s['activation_checkpoint']}) | logits "
        f"{gib['logits']:.2f} | total {gib['sharded']:.2f}",
        f"gradient accumulation over {n} micro-batches: unsharded (one gather and one reduction "
        f"per step) adds {gib['unsharded'] - gib['sharded']:.2f} GiB, total {gib['unsharded']:.2f} "
        f"(parallel.accumulate={s['accumulate_setting']}{_choice(s)})",
    ]
    for mode, fit in s["largest_micro_batch"].items():
        if fit is None:
            lines.append(f"on a {s['gpu_memory_gib']:g} GiB GPU, {mode}: no micro-batch fits 90 % of it")
        else:
            lines.append(
                f"on a {s['gpu_memory_gib']:g} GiB GPU, {mode}: the largest micro-batch that fits 90 % of it is "
                f"{fit['micro_batch']} (plan {fit['total_gib']:.2f} GiB)"
            )
    return "\n".join(lines)
