"""Where a model comes from, in one place: resolve a source, build it on the meta device, materialise it, and
load its weights whole (``load_model``) or as one tensor-parallel rank's shard (``load_tp_shard``).

A source is a preset name (random weights), a Hugging Face Llama folder (``config.json`` + ``model.safetensors``
or its shards: what ladder-export writes, or any pretrained Llama) or a training checkpoint
(``RUN_DIR/checkpoints/step-N``, DCP). Training, the
eval hook, ladder-export, ladder-eval, ladder-bench and ``ladder_train.load_model`` all load through here.
Checkpoints and exports are data: nothing here runs code from them (docs/design.md, "Checkpoints"), and nothing is
built from them unchecked: ``resolve_source``, which every path goes through, checks the shape a config.json or a
checkpoint's trainer entry gives (``model/shape_checks.py``) and a folder's weights against it (names, whole shapes,
dtypes, index entries: ``hf_format.export_tensors``) before any weight is read; a crafted folder is one line, exit 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint import first_line, load_dcp, read_trainer_state, verify_checkpoint
from .errors import InputError
from .folders import COMPLETE_MARKER, folder_kind
from .model import ModelArgs, Transformer, build_on_meta, preset_args
from .model.hf_format import INDEX_FILE, WEIGHTS_FILE, args_from_hf_config, export_tensors
from .model.modules import rope_tables
from .model.presets import PRESETS
from .model.shape_checks import check_model_fields, read_json_object
from .model.tp_sharding import KV_WEIGHTS, check_tp_degree, shard_dim, shard_index

SOURCE_KINDS = ("preset", "export", "checkpoint")


@dataclass(frozen=True)
class ModelSource:
    """What a source names: its kind, the model's shape and, for saved models, the folder; for an export, where
    each parameter is (``hf_format.export_tensors``: checked against the config before any weight is read)."""

    kind: str
    args: ModelArgs
    path: Path | None = None
    tensors: dict[str, tuple[Path, str]] | None = field(default=None, compare=False, repr=False)


def resolve_source(source: str | Path, **overrides) -> ModelSource:
    """The kind and ModelArgs of a preset name (``overrides`` set its fields), an export folder or a training
    checkpoint. Reads only the config and the weights' headers, and checks them (model/shape_checks.py): a crafted
    or ill-formed folder raises InputError (one line naming the file and the field), as does anything else, and a
    FIFO, device or directory where a file of it belongs (``files.is_plain_file``). A checkpoint is checked against
    its manifest before its trainer entry is read (a damaged one: CheckpointError); each file is hashed once a process.
    """
    if str(source) in PRESETS:
        return ModelSource("preset", preset_args(str(source), **overrides))
    path = Path(source)
    kind = folder_kind(path)
    if kind == "incomplete checkpoint":
        raise InputError(f"{path}: not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    if kind is None:
        raise InputError(
            f"{str(source)!r} is neither a model preset ({', '.join(PRESETS)}), an export folder "
            f"(config.json + {WEIGHTS_FILE} or {INDEX_FILE}) nor a training checkpoint (RUN_DIR/checkpoints/step-N)"
        )
    if overrides:
        raise InputError(f"{path}: field overrides apply to presets only, not to {kind}s")
    if kind == "export":
        config_path = path / "config.json"
        config = read_json_object(config_path)
        try:
            args = args_from_hf_config(config)
        except KeyError as err:
            raise InputError(f"{config_path}: missing key {err}") from None
        except InputError as err:  # an unsupported or ill-formed field, named
            raise InputError(f"{config_path}: {err}") from None
        return ModelSource(kind, args, path, export_tensors(path, args))
    verify_checkpoint(path, no_dist=True)  # the manifest before any other read (the trainer entry's shape)
    return ModelSource(kind, checkpoint_args(path), path)


def checkpoint_args(path: Path) -> ModelArgs:
    """The model shape a training checkpoint's trainer entry gives, checked field by field before anything is
    built from it (a crafted entry: InputError naming the field; an unreadable one stays a CheckpointError)."""
    state = read_trainer_state(path)
    where = f"{path}: the trainer entry"
    if not isinstance(state, dict) or "model_args" not in state:
        raise InputError(f"{where} has no model_args (the model's shape)")
    return check_model_fields(state["model_args"], where, prefix="model_args.")


def materialize(model: Transformer, device: str | torch.device) -> Transformer:
    """Give a meta model uninitialised storage on ``device`` and its rope tables (buffers no file holds);
    every parameter must be loaded afterwards."""
    model.to_empty(device=device)
    model.init_rope()
    return model


def model_from_state(args: ModelArgs, state: dict[str, torch.Tensor], device: str | torch.device) -> Transformer:
    """A full model holding ``state`` (every parameter, strictly: a missing or extra name is an error)."""
    model = materialize(build_on_meta(args), device)
    model.load_state_dict(state)
    return model


def model_from_checkpoint(path: str | Path, device: str | torch.device = "cpu", verify: bool = True) -> Transformer:
    """The full (unsharded) model of a training checkpoint, in one process, whatever world saved it.
    The checkpoint is verified first (unless the caller just did): a damaged one raises CheckpointError naming it."""
    path = Path(path)
    if verify:
        verify_checkpoint(path, no_dist=True)
    model = materialize(build_on_meta(checkpoint_args(path)), device)
    state = {"model": model.state_dict()}
    load_dcp(state, path, no_dist=True)
    model.load_state_dict(state["model"])
    return model


def load_model(
    source: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, **overrides
) -> Transformer:
    """A full Transformer from a preset name (random weights from the caller's torch seed; ``overrides`` set
    ModelArgs fields, e.g. ``residual="ladder"``), a Hugging Face Llama folder or a training checkpoint.
    Parameters are fp32 (whatever the file's dtype) unless ``dtype`` is given."""
    if str(source) not in PRESETS and folder_kind(source) == "checkpoint":
        model = model_from_checkpoint(source, device)  # verified before anything is read
    else:
        found = resolve_source(source, **overrides)
        if found.kind == "preset":
            with torch.device(device):
                model = Transformer(found.args)
        else:
            read, names = _export_reader(found)
            try:
                model = model_from_state(found.args, {name: read(name, None) for name in names}, device)
            except RuntimeError as err:  # load_state_dict: names or shapes differ from config.json
                raise InputError(f"{found.path}: weights do not match config.json ({first_line(err)})") from None
    return model if dtype is None else model.to(dtype)


# one tensor-parallel rank's shard --------------------------------------------------------------------


def _export_reader(found: ModelSource):
    """Reads a tensor, or one rank's slice of it, straight from the folder's safetensors file(s) (names and shapes
    checked by ``resolve_source``): nothing else is loaded, and each shard file is opened once, when first needed."""
    from safetensors import safe_open

    handles = {}

    def read(name: str, index: tuple[slice, ...] | None) -> torch.Tensor:
        file, file_name = found.tensors[name]
        if file not in handles:
            handles[file] = safe_open(file, framework="pt")
        handle = handles[file]
        return handle.get_slice(file_name)[index] if index else handle.get_tensor(file_name)

    return read, set(found.tensors)


def _dcp_layouts(args: ModelArgs, tp: int, device_type: str, group) -> dict:
    """(mesh, placements) for DCP to read each kind of parameter: by its shard dimension (None: replicated) and,
    when KV heads are replicated (tp above n_kv_heads), ``"kv"`` for wk / wv: a (n_kv_heads, tp / n_kv_heads)
    mesh of the TP ranks in order, sharded over its first dimension, so TP rank r reads KV head
    r // (tp / n_kv_heads), as model/tp_sharding.py's ``shard_index`` says. DCP reads by the mesh coordinates
    alone; no collective runs over these meshes (both dimensions name the TP group)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard

    mesh = DeviceMesh.from_group(group, device_type)
    layouts = {None: (mesh, [Replicate()]), 0: (mesh, [Shard(0)]), 1: (mesh, [Shard(1)])}
    if tp > args.n_kv_heads:
        ranks = torch.tensor(dist.get_process_group_ranks(group)).reshape(args.n_kv_heads, -1)
        kv_mesh = DeviceMesh.from_group([group, group], device_type, ranks, mesh_dim_names=("kv", "replica"))
        layouts["kv"] = (kv_mesh, [Shard(0), Replicate()])
    return layouts


def _checkpoint_reader(path: Path, model: Transformer, tp_rank: int, tp_size: int, device, group):
    """This rank's shard of every parameter of a training checkpoint (DCP), whatever world saved it.

    Each sharded parameter is asked for as a DTensor sharded like the TP plan over the TP group, so DCP
    reads only this rank's rows or columns (and reshards from the training layout); replicated ones are
    read whole. With one rank there is no group and DCP reads in this process alone."""
    shards = {}
    if tp_size > 1:
        from torch.distributed.tensor import DTensor

        layouts = _dcp_layouts(model.args, tp_size, torch.device(device).type, group)
    for name, param in model.named_parameters():  # ``model`` is on the meta device: shapes only
        index = shard_index(name, param.shape, model.args, tp_rank, tp_size)
        local = torch.empty(param[index].shape if index else param.shape, device=device)
        if tp_size > 1:
            kind = "kv" if "kv" in layouts and name.endswith(KV_WEIGHTS) else shard_dim(name)
            mesh, placements = layouts[kind]
            local = DTensor.from_local(
                local, mesh, placements, run_check=False, shape=param.shape, stride=param.stride()
            )
        shards[name] = local
    load_dcp({"model": shards}, path, group=group, no_dist=tp_size == 1, verify=True)
    return {name: t.to_local() if tp_size > 1 else t for name, t in shards.items()}


@torch.no_grad()
def load_tp_shard(
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
    random weights (model/tp_sharding.py says which dimension of which weight is split, and which KV head a rank
    holds when the TP degree is above ``n_kv_heads``: each is then replicated on tp / n_kv_heads ranks).

    A preset is initialised exactly as ``torch.manual_seed(seed)`` + ``Transformer.init_weights`` would
    initialise the full model on ``device`` (one full tensor at a time, then sliced), so every TP degree
    holds the same function. A checkpoint is read collectively over ``group`` (default: the world), the
    TP group. The model is in eval mode, with no communicator: at TP > 1 it computes partial sums until one is
    installed, so TP inference loads through ``inference.load_tp_model``, which installs it."""
    found = resolve_source(source, **overrides)
    args = found.args
    check_tp_degree(args, tp_size, str(source))
    model = build_on_meta(args)
    if found.kind == "checkpoint":
        shards = _checkpoint_reader(found.path, model, tp_rank, tp_size, device, group or dist.group.WORLD)
    elif found.kind == "export":
        read, _ = _export_reader(found)  # names and whole shapes checked against config.json: slices fit
    else:
        torch.manual_seed(seed)
    for name, param in list(model.named_parameters()):
        index = shard_index(name, param.shape, args, tp_rank, tp_size)
        if found.kind == "checkpoint":
            local = shards[name]
        elif found.kind == "export":
            local = read(name, index)
        else:  # the same RNG draws, in the same order, as init_weights on the full model
            full = torch.empty(param.shape, device=device)
            std = model.param_init_std(name)
            full = nn.init.ones_(full) if std is None else nn.init.normal_(full, mean=0.0, std=std)
            local = full[index].clone() if index else full  # a row slice is a view: keep only the shard
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, nn.Parameter(local.to(device, dtype).contiguous(), False))
    cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval()


# a training run's starting weights ---------------------------------------------------------------------

# what must agree between a run's model and the weights it starts from: every parameter's shape and the function
# of the parts a layout does not change. The residual layout may differ: that is the conversion to a ladder.
INIT_MATCH_FIELDS = (
    "vocab_size",
    "dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "ffn_dim",
    "tie_embeddings",
    "rope_theta",
    "rope_scaling",
    "norm_eps",
)


def _same(a, b) -> bool:
    """Equal, floats to float32 precision (a config.json may write 1e-5 as 9.999999747378752e-06)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def check_init_source(source: str | Path, run_args: ModelArgs, where: str = "checkpoint.init_from") -> ModelSource:
    """The saved model a run starts from, after checking that it fits ``run_args`` (reads configs only).
    Raises InputError, one line naming ``where``, for anything else."""
    try:
        found = resolve_source(source)
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    if found.kind == "preset":
        raise InputError(f"{where}={source!s}: a preset has no weights; give a model folder or a checkpoint")
    differ = [
        f"{k} {getattr(found.args, k)!r} there, {getattr(run_args, k)!r} in the recipe"
        for k in INIT_MATCH_FIELDS
        if not _same(getattr(found.args, k), getattr(run_args, k))
    ]
    if differ:
        raise InputError(f"{where}={source!s}: the model differs from the recipe's model.* ({'; '.join(differ)})")
    return found


@torch.no_grad()
def load_initial_weights(model: nn.Module, found: ModelSource) -> None:
    """Copy a saved model's weights into a training model, sharded (FSDP2/HSDP) or not, in place.

    A folder is read one tensor at a time (each rank keeps its shard of it, as ``init_sharded_weights`` does
    with random weights); a training checkpoint is read by DCP straight into the shards, whatever world saved
    it. ``found`` comes from ``check_init_source``."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.tensor import DTensor, distribute_tensor

    state = get_model_state_dict(model)  # clean names -> the parameters themselves (DTensor shards under FSDP)
    if found.kind == "checkpoint":
        load_dcp({"model": state}, found.path, verify=True)
        set_model_state_dict(model, state)
        return
    read, available = _export_reader(found)
    if available != set(state):
        raise InputError(f"{found.path}: parameters differ from the model's: {sorted(available ^ set(state))[:4]}")
    for name, param in state.items():
        full = read(name, None).to(param.dtype)
        if isinstance(param, DTensor):
            local = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(full)
