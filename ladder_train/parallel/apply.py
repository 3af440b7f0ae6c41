"""Parallelisms as plain functions, applied in a fixed order: activation checkpointing, then
torch.compile, then fully_shard (each block, then the root); the compute dtype they run in (``resolve_dtype``, from
the names recipes and flags use); what FSDP does around each micro-batch (the MicroBatchPlan parallelize returns);
and the sharded initialisation that makes the weights independent of how the model is sharded."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..config import ParallelConfig
from ..model import Transformer

# selective checkpointing keeps the outputs of these ops (the matmuls and attention: most of a block's FLOPs)
# and recomputes everything else in backward (norms, rope, SiLU, products and adds: cheap, memory-bound)
_aten = torch.ops.aten
SAVED_IN_SELECTIVE = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_IN_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: Transformer, mode: str, every: int) -> None:
    """Recompute block activations in backward: every block (full), every ``every``-th (every_n), or in every
    block all but the outputs of SAVED_IN_SELECTIVE (selective: torch.utils.checkpoint's op-level policy)."""
    if mode == "none":
        return
    # non-reentrant checkpointing (checkpoint_wrapper's default), which a selective context_fn needs
    options = {"context_fn": functools.partial(create_selective_checkpoint_contexts, _selective_policy)}
    for i, block in enumerate(model.layers):
        if mode in ("full", "selective") or i % every == 0:
            extra = options if mode == "selective" else {}
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False, **extra)


# torch.compile's backend for the blocks. The GPU path uses inductor; a test on the CPU sets
# LADDER_COMPILE_BACKEND=aot_eager (autograd traced, no code generated) to check graphs and numerics quickly.
COMPILE_BACKEND_ENV = "LADDER_COMPILE_BACKEND"
DEFAULT_COMPILE_BACKEND = "inductor"


def apply_compile(model: Transformer, backend: str | None = None) -> None:
    """Compile each block on its own, and the loss (model.TokenLoss); blocks of one kind share one graph (a
    ladder's first block, which has no pending outputs, and blocks with or without a checkpoint wrapper are the
    other kinds). FSDP's hooks are marked dynamo-disabled and stay outside the graph: no block breaks or recompiles
    for its sharding."""
    backend = backend or os.environ.get(COMPILE_BACKEND_ENV) or DEFAULT_COMPILE_BACKEND
    for block in model.layers:
        block.compile(backend=backend)
    # one graph: the upcast fused into the softmax's reductions, only the bf16 logits kept for the backward
    model.loss.compile(backend=backend, fullgraph=True)


# compute dtypes by the names recipes and flags use (train.dtype, --dtype)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """bf16 compute on GPUs, fp32 on the CPU unless the recipe insists: CPU bf16 speed depends on the chip's
    bf16 instructions (1.4x faster than fp32 on an AVX512-BF16 EPYC, docs/benchmarks.md), and the tests and
    demo compare against fp32 references."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def apply_fsdp(model: Transformer, mesh: DeviceMesh, param_dtype: torch.dtype, blocks_per_unit: int = 1) -> None:
    """Shard the blocks, ``blocks_per_unit`` consecutive ones as one FSDP unit, then the root (embeddings, final
    norm). A unit's blocks are gathered and reduced together and FSDP's hooks run once for them; each parameter is
    sharded alone either way, so checkpoints do not depend on the unit. bf16 compute keeps fp32 master
    weights and reduces gradients in fp32. The last unit and the root stay unsharded after forward, as
    backward needs them first. One replica shards over the shard dimension alone: on the 2-D mesh FSDP2 takes its
    HSDP path even then, an all-reduce over a group of one per block and micro-batch, and when gradients
    accumulate every block's fp32 reduce output is held until the backward ends (pytorch/pytorch#179128)."""
    if mesh.ndim == 2 and mesh.shape[0] == 1:
        mesh = mesh["dp_shard"]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    # A block's inputs are the bf16 stream(s) the embedding made and the rope tables, which stay fp32 as in
    # inference (loading.py): FSDP's default cast of floating inputs would copy both tables to bf16 at every block
    # call of every micro-batch (640 copies a step at 1.2B, micro-batch 2) and rotate with coarser angles.
    block_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    # FSDP hands each block its inputs as autograd views, and the first ladder block returns its input
    # stream untouched (its outputs join one module late), so FSDP warns that a view could lose its
    # pre-backward hook to an in-place op. Nothing adds in place to a block's outputs; the gradients are
    # checked against one process in tests/test_train.py.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDP(Block|CheckpointWrapper)\) returned a view")
    blocks = list(model.layers)
    for start in range(0, len(blocks), blocks_per_unit):
        unit = blocks[start : start + blocks_per_unit]
        last = start + blocks_per_unit >= len(blocks)
        fully_shard(
            unit if len(unit) > 1 else unit[0], mesh=mesh, mp_policy=block_policy, reshard_after_forward=not last
        )
    # The root (the tied embedding/head and the final norm) stays unsharded after forward: backward
    # starts with the head's gradient, so resharding would only all-gather the embedding again at once
    # (fully_shard's docs: False "for the root module, because the root module is typically required
    # immediately when the backward pass begins"; torchtitan does the same). An explicit True would
    # override FSDP2's own root default. Its gradient is still reduce-scattered and the unsharded copy
    # freed at the end of backward, so only one all-gather per micro-batch changes, not the numbers.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)


# --- what FSDP does around each micro-batch: decided once by parallelize, asked by the micro-batch loop ---------------

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
        """The line a run prints about its gradients, or None without FSDP."""
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


def parallelize(
    model: Transformer,
    cfg: ParallelConfig,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    unsharded_fits: UnshardedFits | None = None,
) -> tuple[Transformer, MicroBatchPlan]:
    """The model with activation checkpointing, compile and FSDP applied in that order, and the plan of what FSDP
    does around each micro-batch (``unsharded_fits``: the memory plan's answer for parallel.accumulate=auto)."""
    apply_activation_checkpointing(model, cfg.activation_checkpoint, cfg.ac_every)
    if cfg.compile:
        apply_compile(model)
    # one fp32 process has nothing to shard, reduce or cast: FSDP would only add copies per step
    if mesh.size() > 1 or param_dtype != torch.float32:
        apply_fsdp(model, mesh, param_dtype, cfg.blocks_per_fsdp_unit)
    replicate = mesh.shape[0] if mesh.ndim == 2 else 1
    return model, plan_micro_batches(model, cfg.accumulate, replicate, unsharded_fits)


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
        std = model.param_init_std(name)
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
