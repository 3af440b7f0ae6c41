"""The one check of a model's shape before anything is built from it: the type and range of every ModelArgs field.

A model folder's ``config.json`` (after ``hf_format``'s key mapping) and a training checkpoint's ``trainer`` entry
(its ``model_args``) are data a user hands in. A crafted value (a string size, zero heads, heads that do not divide
the hidden size, a vocabulary of 3e9) must give one line naming the file and the field (InputError, exit 2), never
a traceback deep inside the model or an attempt to allocate terabytes.

The transformers class an export carries (``ladder_train/hf/configuration_ladder_llama.py``, which may import only
transformers) repeats these checks on config.json's names with the same limits and messages; change both together
(tests/test_hf.py compares their verdicts).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path

from ..errors import InputError
from ..files import is_plain_file
from .modules import ROPE_SCALING_KEYS
from .transformer import RESIDUAL_LAYOUTS, ModelArgs

# The largest tensor a model may have, in elements, counted whole (before any TP slice): 2**34 = 17.2 G elements,
# 64 GiB in fp32. The largest tensor of any released Llama is below 2**31 (Llama-3.1-405B's embedding, 128,256 x
# 16,384 = 2.1 G), so real models fit 8 times over, while a crafted size (a vocabulary of 3e9 at dim 64 is 1.9e11)
# is refused before torch is asked for the memory.
MAX_TENSOR_ELEMENTS = 2**34
# All parameters together: 2**40 = 1.1 T (4 TiB in fp32); the largest released dense Llama has 405 G.
MAX_PARAMETERS = 2**40
# Each size on its own: no real model has 2**24 (16.8 M) of any (vocabularies <= 256 K, contexts <= 10 M tokens).
MAX_SIZE = 2**24
# Layers are Python modules built one by one: 4,096 is 30 times the deepest released Llama (126 layers).
MAX_LAYERS = 2**12

SIZE_FIELDS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len")
REQUIRED_FIELDS = ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim")  # the rest have defaults
FLOAT_FIELDS = ("rope_theta", "norm_eps", "init_std")
FIELDS = tuple(f.name for f in dataclasses.fields(ModelArgs))


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object, or one line naming it (a FIFO, device or directory too, unopened)."""
    if not is_plain_file(path):
        raise InputError(f"{path}: no such file")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError, UnicodeDecodeError
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"{path}: not valid JSON ({reason})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a JSON object (a {type(data).__name__})")
    return data


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_model_fields(fields, where: str = "", names: Mapping[str, str] | None = None, prefix: str = "") -> ModelArgs:
    """The ModelArgs of ``fields`` (ModelArgs field -> value) after checking every one; raises InputError, one line
    ``{where}: {name}={value!r}: ...``, naming the field as the file calls it (``prefix`` + ``names``' key for it,
    default the field itself). Unknown fields and missing sizes are refused by name."""
    names = names or {}

    def label(field: str) -> str:
        return prefix + names.get(field, field)

    def fail(message: str):
        raise InputError(f"{where}: {message}" if where else message)

    if not isinstance(fields, dict):
        fail(f"{prefix.rstrip('.') or 'the model'} is not an object: {fields!r:.60}")
    unknown = [k for k in fields if k not in FIELDS]
    if unknown:
        fail(f"unknown field {label(str(unknown[0]))!r} (a model's fields: {', '.join(FIELDS)})")
    missing = [k for k in REQUIRED_FIELDS if k not in fields]
    if missing:
        fail(f"missing {label(missing[0])}")
    args = dict(fields)
    for field in SIZE_FIELDS:
        value = args.get(field, getattr(ModelArgs, field, None))
        if field == "n_kv_heads" and value is None:
            continue
        bound = MAX_LAYERS if field == "n_layers" else MAX_SIZE
        if not _is_int(value) or not 0 < value <= bound:
            fail(f"{label(field)}={value!r}: must be a positive integer, at most {bound:,}")
    for field in FLOAT_FIELDS:
        if field in args and not _is_positive_number(args[field]):
            fail(f"{label(field)}={args[field]!r}: must be a positive number")
    if not isinstance(args.get("tie_embeddings", True), bool):
        fail(f"{label('tie_embeddings')}={args['tie_embeddings']!r}: must be true or false")
    residual = args.get("residual", "standard")
    if not isinstance(residual, str) or residual not in RESIDUAL_LAYOUTS:
        fail(f"{label('residual')}={residual!r}: must be one of {', '.join(RESIDUAL_LAYOUTS)}")
    model = ModelArgs(**args)
    for message in (*_shape_problems(model, label), *_rope_scaling_problems(model.rope_scaling, label)):
        fail(message)
    return model


def _shape_problems(args: ModelArgs, label) -> list[str]:
    """What is wrong with the sizes together (all are positive integers by now): heads, layers, tensor sizes."""
    if args.dim % args.n_heads:
        return [f"{label('n_heads')}={args.n_heads}: does not divide {label('dim')}={args.dim}"]
    if args.head_dim % 2:
        return [
            f"{label('dim')} / {label('n_heads')} = {args.head_dim}: the head dimension must be even "
            "(rotary embeddings rotate pairs)"
        ]
    if args.n_heads % args.n_kv_heads:
        return [f"{label('n_kv_heads')}={args.n_kv_heads}: does not divide {label('n_heads')}={args.n_heads}"]
    ladder = args.ladder_layers
    if ladder is not None and args.residual != "ladder":  # as the config's model rules and the transformers class say
        return [
            f"{label('ladder_layers')}={ladder!r}: only a ladder has ladder layers "
            f"(null for {label('residual')}={args.residual!r})"
        ]
    if ladder is not None and (not _is_int(ladder) or not 0 <= ladder <= args.n_layers):
        return [f"{label('ladder_layers')}={ladder!r}: must be an integer in [0, {label('n_layers')}={args.n_layers}]"]
    desync = args.desync_field_problems(label)
    if desync:
        return desync
    largest = {
        ("vocab_size", "dim"): args.vocab_size * args.dim,
        ("ffn_dim", "dim"): args.ffn_dim * args.dim,
        ("max_seq_len", "dim"): args.max_seq_len * args.head_dim,  # the rope tables: max_seq_len x head_dim
    }
    for (a, b), elements in largest.items():
        if elements > MAX_TENSOR_ELEMENTS:
            return [
                f"{label(a)}={getattr(args, a)} and {label(b)}={getattr(args, b)} make a tensor of {elements:,} "
                f"elements, more than 2**34 (64 GiB in fp32, 8 times the largest of any released model)"
            ]
    kv_dim = args.n_kv_heads * args.head_dim
    per_layer = 2 * args.dim * args.dim + 2 * args.dim * kv_dim + 3 * args.dim * args.ffn_dim + 2 * args.dim
    total = args.vocab_size * args.dim * (1 if args.tie_embeddings else 2) + args.n_layers * per_layer
    if total > MAX_PARAMETERS:
        return [f"{label('n_layers')}={args.n_layers}: {total:,} parameters in all, more than 2**40"]
    return []


def _rope_scaling_problems(scaling, label) -> list[str]:
    """Llama-3.1's scaling, the one supported: exactly rope_type llama3 and its four positive numbers."""
    if scaling is None:
        return []
    where = label("rope_scaling")
    if not isinstance(scaling, dict):
        return [f"{where}={scaling!r:.60}: must be an object (rope_type llama3) or null"]
    if scaling.get("rope_type") != "llama3":
        return [f"{where}.rope_type={scaling.get('rope_type')!r}: only llama3 (Llama-3.1) scaling is supported"]
    for key in scaling:
        if key not in ("rope_type", *ROPE_SCALING_KEYS):
            return [f"{where}: unknown key {key!r} (llama3 scaling has {', '.join(ROPE_SCALING_KEYS)})"]
    for key in ROPE_SCALING_KEYS:
        if not _is_positive_number(scaling.get(key)):
            return [f"{where}.{key}={scaling.get(key)!r}: must be a positive number"]
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        return [f"{where}: high_freq_factor must exceed low_freq_factor (it divides by their difference)"]
    return []
