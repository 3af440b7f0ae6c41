"""Tensor parallelism for inference: shard the one Transformer over TP ranks, and the reduce hook.

Sharding (Megatron style): q, k, v, gate and up are split by output rows (each rank holds whole heads and
a slice of the MLP hidden units); the attention output and the down projection are split by input
columns, so each module gives a partial sum per rank. Embeddings and norms are replicated. Each rank
builds the model on the meta device and materialises only its own shard.

The reduce hook, :class:`TPCommunicator`, turns those partial sums into full sums through functional
collectives (``torch.ops._c10d_functional.all_reduce`` / ``wait_tensor``). We use them rather than
``dist.all_reduce(async_op=True)`` work handles because they are the same ops eagerly and under
``torch.compile``: a traced graph keeps each all-reduce where the module finishes and its wait where the
output joins the stream, and NCCL collectives inside that graph can be captured by CUDA graphs, while
Python work handles cannot. Eagerly (the CPU path) they are plain async collectives: the issue returns at
once, the wait blocks until the sum has arrived.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import COMPLETE_MARKER, load_dcp, read_trainer_state
from ..model import Communicator, ModelArgs, Transformer, preset_args
from ..model.hf_format import args_from_hf_config, from_hf_name
from ..model.presets import PRESETS
from ..model.transformer import rope_tables

COMM_MODES = ("sync", "async", "none")

# parameter name suffix -> the dimension split across TP ranks (0 = output rows, 1 = input columns)
SHARD_DIMS = {
    "attention.wq.weight": 0,
    "attention.wk.weight": 0,
    "attention.wv.weight": 0,
    "mlp.w_gate.weight": 0,
    "mlp.w_up.weight": 0,
    "attention.wo.weight": 1,
    "mlp.w_down.weight": 1,
}


@torch.library.custom_op("ladder_train::fence", mutates_args=())
def _fence(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors``, produced together by one op that inductor cannot see into, fuse or split."""
    return [t.clone() for t in tensors]


@_fence.register_fake
def _(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in tensors]


def comm_mode_for(residual: str) -> str:
    """Standard and parallel add each output at once (sync); the ladder waits one module later (async)."""
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


def check_tp_degree(args: ModelArgs, tp: int, source: str = "model"):
    """Fail before any loading when ``tp`` cannot split the heads, kv heads or MLP hidden units evenly."""
    for field in ("n_heads", "n_kv_heads", "ffn_dim"):
        value = getattr(args, field)
        if value % tp:
            raise ValueError(f"{source}: tensor-parallel degree {tp} does not divide {field}={value}")


def shard_dim(name: str) -> int | None:
    """The dimension of parameter ``name`` split across TP ranks, or None if it is replicated."""
    for suffix, dim in SHARD_DIMS.items():
        if name.endswith(suffix):
            return dim
    return None


def shard_slice(shape: torch.Size, dim: int, rank: int, tp: int) -> tuple[slice, ...]:
    size = shape[dim] // tp
    index = [slice(None)] * len(shape)
    index[dim] = slice(rank * size, (rank + 1) * size)
    return tuple(index)


def _export_reader(path: Path):
    """Reads each rank's slice straight from ``model.safetensors``: the full tensors are never loaded."""
    from safetensors import safe_open

    handle = safe_open(path / "model.safetensors", framework="pt")
    names = {from_hf_name(k): k for k in handle.keys() if k != "lm_head.weight"}

    def read(name: str, index: tuple[slice, ...] | None) -> torch.Tensor:
        if name not in names:
            raise ValueError(f"{path / 'model.safetensors'}: missing parameter {name}")
        return handle.get_slice(names[name])[index] if index else handle.get_tensor(names[name])

    return read, set(names)


def _checkpoint_reader(path: Path, model: Transformer, tp_rank: int, tp_size: int, device, group):
    """This rank's shard of every parameter of a training checkpoint (DCP), whatever world saved it.

    Each sharded parameter is asked for as a DTensor sharded like the TP plan over the TP group, so DCP
    reads only this rank's rows or columns (and reshards from the training layout); replicated ones are
    read whole. With one rank there is no group and DCP reads in this process alone."""
    shards = {}
    if tp_size > 1:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Replicate, Shard

        mesh = DeviceMesh.from_group(group, torch.device(device).type)
    for name, param in model.named_parameters():  # ``model`` is on the meta device: shapes only
        dim = shard_dim(name)
        index = shard_slice(param.shape, dim, tp_rank, tp_size) if dim is not None else None
        local = torch.empty(param[index].shape if index else param.shape, device=device)
        if tp_size > 1:
            placement = Shard(dim) if dim is not None else Replicate()
            local = DTensor.from_local(
                local, mesh, [placement], run_check=False, shape=param.shape, stride=param.stride()
            )
        shards[name] = local
    load_dcp({"model": shards}, path, group=group, no_dist=tp_size == 1, verify=True)
    return {name: t.to_local() if tp_size > 1 else t for name, t in shards.items()}


def resolve_args(source: str | Path, **overrides) -> tuple[ModelArgs, str]:
    """The ModelArgs of a preset name (with field overrides), an export folder or a training checkpoint
    (``RUN_DIR/checkpoints/step-N``), and its kind."""
    if str(source) in PRESETS:
        return preset_args(str(source), **overrides), "preset"
    path = Path(source)
    kind = None
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        kind = "export"
    elif (path / ".metadata").is_file():  # a DCP checkpoint
        if not (path / COMPLETE_MARKER).is_file():
            raise ValueError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
        kind = "checkpoint"
    if kind is None:
        raise ValueError(
            f"{source!r} is neither a model preset ({', '.join(PRESETS)}), an export folder "
            "(config.json + model.safetensors) nor a training checkpoint (RUN_DIR/checkpoints/step-N)"
        )
    if overrides:
        raise ValueError(f"{path}: field overrides apply to presets only, not to {kind}s")
    if kind == "export":
        return args_from_hf_config(json.loads((path / "config.json").read_text())), kind
    return ModelArgs(**read_trainer_state(path)["model_args"]), kind


@torch.no_grad()
def load_tp_model(
    source: str | Path,
    tp_rank: int = 0,
    tp_size: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    group: dist.ProcessGroup | None = None,
    **overrides,
) -> Transformer:
    """This rank's shard of a model, from an export folder, a training checkpoint or a preset with
    random weights.

    A preset is initialised exactly as ``torch.manual_seed(seed)`` + ``Transformer.init_weights`` would
    initialise the full model on ``device`` (one full tensor at a time, then sliced), so every TP degree
    holds the same function. A checkpoint is read collectively over ``group`` (default: the world), the
    TP group. The model is in eval mode, with no communicator installed."""
    args, kind = resolve_args(source, **overrides)
    check_tp_degree(args, tp_size, str(source))
    with torch.device("meta"):
        model = Transformer(args)
    if kind == "checkpoint":
        shards = _checkpoint_reader(Path(source), model, tp_rank, tp_size, device, group or dist.group.WORLD)
    elif kind == "export":
        read, available = _export_reader(Path(source))
        expected = {name for name, _ in model.named_parameters()}
        if available != expected:
            raise ValueError(f"{source}: parameters differ from config.json: {sorted(available ^ expected)[:4]}")
    else:
        torch.manual_seed(seed)
    for name, param in list(model.named_parameters()):
        dim = shard_dim(name)
        index = shard_slice(param.shape, dim, tp_rank, tp_size) if dim is not None else None
        if kind == "checkpoint":
            local = shards[name]
        elif kind == "export":
            local = read(name, index)
        else:  # the same RNG draws, in the same order, as init_weights on the full model
            full = torch.empty(param.shape, device=device)
            std = model.init_std(name)
            full = nn.init.ones_(full) if std is None else nn.init.normal_(full, mean=0.0, std=std)
            local = full[index].clone() if index else full  # a row slice is a view: keep only the shard
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, nn.Parameter(local.to(device, dtype).contiguous(), False))
    cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval()
