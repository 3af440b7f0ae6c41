"""The export format, which is the Hugging Face Llama folder: ``config.json`` plus ``model.safetensors`` (or
shards listed in ``model.safetensors.index.json``) with Hugging Face Llama parameter names.

Any Llama folder reads in (tied or untied head, GQA, ``rope_theta``, ``rope_scaling`` of type ``llama3``,
``rms_norm_eps``); anything this model cannot compute (biases, other rope types or activations, other
architectures) is refused with one line naming the field. A standard-layout export is a ``LlamaForCausalLM``.
Parallel and ladder exports compute a different function from the same weights, so they declare their own
``model_type`` (``ladder_llama``, architecture ``LadderLlamaForCausalLM``), the fields ``residual`` and
``ladder_layers``, and an ``auto_map`` to the transformers classes they carry beside the weights
(``ladder_train/hf``): a Llama loader never runs them as a Llama. A desync model's config also holds its four
desync fields under their ModelArgs names (``DESYNC_KEYS``), as ``ladder_layers`` is; other layouts' configs do not
have them, and a config without them reads as the defaults.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from ..errors import InputError
from ..files import copy_to, is_file_name, is_plain_file, refuse_link, write_text
from ..folders import INDEX_FILE, WEIGHTS_FILE
from ..hf import ARCHITECTURE as LADDER_ARCHITECTURE
from ..hf import AUTO_MAP, model_file_paths
from ..hf import MODEL_TYPE as LADDER_MODEL_TYPE
from .modules import ROPE_SCALING_KEYS
from .shape_checks import check_model_fields, read_json_object
from .transformer import ModelArgs, Transformer, build_on_meta

# project name pattern -> HF name pattern ({i} is the layer index)
_LAYER_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # untied heads only
}
# config.json key -> ModelArgs field, for the sizes every Llama config.json states (num_key_value_heads optional)
HF_SIZE_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "intermediate_size": "ffn_dim",
}
# config.json keys of a desync model, named as ModelArgs names them (like ladder_layers): key -> default when absent
DESYNC_KEYS = {"desync_tp": None, "desync_reduce_every": 2, "desync_pattern": None, "desync_layers": None}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


def to_hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _LAYER_RE.match(name)
    if not match or match.group(2) not in _LAYER_NAMES:
        raise KeyError(f"no Hugging Face name for parameter {name!r}")
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"


# bos / eos / pad ids when the export's tokenizer is unknown: StarCoder's <|endoftext|>, the default tokenizer
DEFAULT_TOKEN_IDS = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}


def is_llama(args: ModelArgs) -> bool:
    """Whether a Llama computes this model (every layer standard)."""
    return set(args.layer_layouts()) == {"standard"}


def hf_config(args: ModelArgs, dtype: torch.dtype = torch.float32, token_ids: dict | None = None) -> dict:
    """config.json: the LlamaConfig fields, plus ladder-train's own layout fields and, for a model a Llama does not
    compute (parallel, ladder, desync), the ``auto_map`` to the transformers classes beside the weights.
    ``token_ids``: bos / eos / pad."""
    llama = is_llama(args)
    config = {
        "architectures": ["LlamaForCausalLM" if llama else LADDER_ARCHITECTURE],
        "model_type": "llama" if llama else LADDER_MODEL_TYPE,
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "max_position_embeddings": args.max_seq_len,
        "rope_theta": args.rope_theta,
        "rope_scaling": args.rope_scaling,
        "rms_norm_eps": args.norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": args.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": args.init_std,
        **(token_ids or DEFAULT_TOKEN_IDS),
        "torch_dtype": str(dtype).removeprefix("torch."),
        "residual": args.residual,
        "ladder_layers": args.ladder_layers,
    }
    if args.residual == "desync":  # written only where they act: other layouts' configs stay as they were
        config.update({key: getattr(args, key) for key in DESYNC_KEYS})
    return config if llama else {**config, "auto_map": AUTO_MAP}


def _refuse_unsupported(config: dict) -> None:
    """One line naming the first field of ``config`` that this model cannot compute."""
    model_type = config.get("model_type", "llama")
    if model_type not in ("llama", LADDER_MODEL_TYPE):
        raise InputError(f"model_type={model_type!r}: only Llama models ({LADDER_MODEL_TYPE} too) can be read")
    for field in ("attention_bias", "mlp_bias"):
        if config.get(field):
            raise InputError(f"{field}={config[field]}: biases are not supported (Llama has none)")
    if config.get("hidden_act", "silu") != "silu":
        raise InputError(f"hidden_act={config['hidden_act']!r}: only silu (SwiGLU) is supported")
    _rope(config)


def _rope(config: dict) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling or None) from either config form: ``rope_theta`` + ``rope_scaling`` (transformers
    4) or ``rope_parameters`` (transformers 5, theta inside)."""
    where = "rope_parameters" if "rope_parameters" in config else "rope_scaling"
    params = config.get(where) or {}
    if not isinstance(params, dict):
        raise InputError(f"{where}={params!r:.60}: must be an object or null")
    params = dict(params)
    theta = params.pop("rope_theta", config.get("rope_theta", 10000.0)) if where == "rope_parameters" else None
    theta = config.get("rope_theta", 10000.0) if theta is None else theta
    rope_type = params.get("rope_type", params.get("type", "default" if not params else None))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise InputError(f"{where}.rope_type={rope_type!r}: only llama3 (Llama-3.1) scaling is supported")
    missing = [k for k in ROPE_SCALING_KEYS if k not in params]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}")
    return theta, {"rope_type": "llama3", **{k: params[k] for k in ROPE_SCALING_KEYS}}


# ModelArgs field -> its config.json key, to name a bad value as the file does
HF_FIELD_NAMES = {
    **{ours: theirs for theirs, ours in HF_SIZE_KEYS.items()},
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "init_std": "initializer_range",
    "tie_embeddings": "tie_word_embeddings",
}


def args_from_hf_config(config: dict) -> ModelArgs:
    """The ModelArgs of a Llama config.json, every field checked (``validate.check_model_fields``): raises
    InputError naming an unsupported or ill-formed field, KeyError for a missing required one."""
    if not isinstance(config, dict):
        raise InputError(f"not a JSON object (a {type(config).__name__})")
    _refuse_unsupported(config)
    theta, scaling = _rope(config)
    sizes = {ours: config[theirs] for theirs, ours in HF_SIZE_KEYS.items() if theirs != "num_key_value_heads"}
    fields = {
        **sizes,
        "n_kv_heads": config.get("num_key_value_heads"),
        "max_seq_len": config.get("max_position_embeddings", 2048),
        "rope_theta": theta,
        "norm_eps": config.get("rms_norm_eps", 1e-5),
        "init_std": config.get("initializer_range", 0.02),
        "residual": config.get("residual", "standard"),
        "ladder_layers": config.get("ladder_layers"),
        **{key: config.get(key, default) for key, default in DESYNC_KEYS.items()},
        "tie_embeddings": config.get("tie_word_embeddings", False),  # transformers' LlamaConfig default
        "rope_scaling": scaling,
    }
    rope_key = "rope_parameters" if "rope_parameters" in config else "rope_scaling"
    args = check_model_fields(fields, names={**HF_FIELD_NAMES, "rope_scaling": rope_key})
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != args.head_dim:
        raise InputError(f"head_dim={head_dim!r}: only hidden_size / num_attention_heads is supported")
    return args


def _header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, dtype) from one safetensors header (no tensor is read), or one line naming the file."""
    from safetensors import safe_open

    if not is_plain_file(file):  # a FIFO or device raises here, unopened
        raise InputError(f"{file}: no such file")
    try:
        with safe_open(file, framework="pt") as handle:
            return {k: (tuple(handle.get_slice(k).get_shape()), handle.get_slice(k).get_dtype()) for k in handle.keys()}
    except Exception as err:  # safetensors raises its own SafetensorError (and OSError) on a bad header
        reason = str(err).splitlines()[0] if str(err) else repr(err)
        raise InputError(f"{file}: not a readable safetensors file ({reason})") from None


def _weight_map(path: Path) -> tuple[Path, dict[str, Path]]:
    """(the file that lists the tensors, HF tensor name -> the safetensors file holding it), for a single-file or
    a sharded folder. An index may name only plain files inside the folder (no separator, no ``..``) that exist."""
    index = path / INDEX_FILE
    if not is_plain_file(index):
        return path / WEIGHTS_FILE, dict.fromkeys(_header(path / WEIGHTS_FILE), path / WEIGHTS_FILE)
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(f"{index}: weight_map must be an object of tensor name -> shard file name")
    for shard in sorted(set(weight_map.values())):
        if not is_file_name(shard):
            raise InputError(f"{index}: shard {shard!r} is not a file name inside the folder")
        if not is_plain_file(path / shard):
            raise InputError(f"{index}: shard {shard!r} does not exist in {path}")
    return index, {name: path / shard for name, shard in weight_map.items()}


def export_tensors(path: Path, args: ModelArgs) -> dict[str, tuple[Path, str]]:
    """Our parameter name -> (its safetensors file, the file's name for it), after checking the folder's weights
    against ``args`` before any is read: every header parses, the tensor names are exactly those the config implies
    (a tied model may also store ``lm_head.weight``, which is not read) and each has the shape the config implies,
    whole (before any TP slice) and a floating-point dtype. Raises InputError, one line naming the file."""
    listing, files = _weight_map(path)
    expected = {to_hf_name(name): (name, tuple(p.shape)) for name, p in build_on_meta(args).named_parameters()}
    ignored = {"lm_head.weight"} if args.tie_embeddings else set()
    extra = sorted(set(files) - set(expected) - ignored)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise InputError(f"{listing}: unexpected tensor {extra[0]}{more}: config.json implies no such weight")
    missing = sorted(set(expected) - set(files))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"{listing}: missing tensor {missing[0]}{more}, which config.json implies")
    headers = {}
    for hf_name, (_, shape) in expected.items():
        file = files[hf_name]
        if file not in headers:
            headers[file] = _header(file)
        if hf_name not in headers[file]:
            raise InputError(f"{file}: no tensor {hf_name}, which {listing.name} places there")
        found, dtype = headers[file][hf_name]
        if found != shape:
            raise InputError(f"{file}: tensor {hf_name} has shape {list(found)}, config.json implies {list(shape)}")
        if not dtype.startswith(("F", "BF")):
            raise InputError(f"{file}: tensor {hf_name} has dtype {dtype}, not floating point")
    return {name: (files[hf_name], hf_name) for hf_name, (name, _) in expected.items()}


def save_export(
    model: Transformer, out_dir: str | Path, dtype: torch.dtype = torch.float32, token_ids: dict | None = None
) -> Path:
    """Write ``model.safetensors`` (HF names) and ``config.json`` for a full (unsharded) model, and for a parallel,
    ladder or desync model the transformers files its ``auto_map`` names. A tied head is stored once, as the embedding."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {to_hf_name(k): v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_weights(tensors, out / WEIGHTS_FILE)
    write_text(out / "config.json", json.dumps(hf_config(model.args, dtype, token_ids), indent=2) + "\n")
    if not is_llama(model.args):
        for file in model_file_paths():
            copy_to(file, out / file.name)
    return out


def save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors' ``save_file``, but the file's mode follows the umask like every other file of the folder
    (safetensors writes a private 0600 temporary file and renames it: a cluster's other users could not read it),
    and an OS failure (a folder in the way, no permission, no space) is raised as the OSError it is."""
    from safetensors.torch import save_file

    refuse_link(path)  # safetensors renames its file into place, but the chmod after it would follow a link
    try:
        save_file(tensors, path, metadata={"format": "pt"})
    except Exception as err:  # safetensors' SafetensorError
        raise os_error_of(err, path) from None
    path.chmod(0o666 & ~_umask())


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(err: Exception, path: Path) -> Exception:
    """The OSError that a Rust library's error (safetensors, tokenizers) names only in its text, "... (os error
    21)", naming ``path``, so the console scripts report it in one line; any other error as it is."""
    match = None if isinstance(err, OSError) else _OS_ERROR.search(str(err))
    if match is None:
        return err
    code = int(match.group(1))
    return OSError(code, os.strerror(code), str(path))


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: restored at once
    os.umask(mask)
    return mask
