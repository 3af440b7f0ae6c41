"""Model shapes for ``ladder-predict``: the project's presets (tied head), the Llama shapes of the paper's
size sweep (untied head) and a Hugging Face Llama ``config.json`` (read by ``model/hf_format.py``), each a
``ModelArgs`` with a name. Kept here, apart from ``model/presets.py``: the predictor needs only the sizes, and most
of these shapes are never trained by this project."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..model.hf_format import args_from_hf_config
from ..model.shape_checks import FLOAT_FIELDS, SIZE_FIELDS, check_model_fields, read_json_object
from ..model.transformer import ModelArgs
from ..option_errors import OptionError, layout_fields

# The paper's size sweep, Llama architecture: untied output head, vocabulary 128256 unless given.
LLAMA_SHAPES: dict[str, dict] = {
    "llama-1b": dict(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192),
    "llama-3b": dict(n_layers=28, dim=3072, n_heads=24, n_kv_heads=8, ffn_dim=8192),
    "llama-8b": dict(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336),
    "llama-34b": dict(n_layers=48, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=22016, vocab_size=32000),
    "llama-70b": dict(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672),
    "llama-176b": dict(n_layers=70, dim=14336, n_heads=112, n_kv_heads=112, ffn_dim=57344, vocab_size=250880),
    "llama-405b": dict(n_layers=126, dim=16384, n_heads=128, n_kv_heads=8, ffn_dim=53248),
}
LLAMA_VOCAB = 128256


_ARG_FIELDS = {f.name for f in dataclasses.fields(ModelArgs)}


@dataclass(frozen=True, eq=False)
class Shape:
    """A named ``ModelArgs``; its fields read through (``shape.dim``), ``tied`` is ``tie_embeddings`` (the same
    time, the head reads vocab x dim either way; less memory)."""

    name: str
    args: ModelArgs

    def __getattr__(self, field: str):
        if field == "args":  # not set yet (unpickling)
            raise AttributeError(field)
        return getattr(self.args, field)

    @property
    def tied(self) -> bool:
        return self.args.tie_embeddings

    @property
    def key(self) -> tuple:
        """Equal for shapes of equal name and fields (``Shape`` itself hashes by identity)."""
        return self.name, repr(self.args)

    def layer_layouts(self, residual: str) -> list[str]:
        """``ModelArgs.layer_layouts`` under ``residual``: a hybrid ladder keeps its first L - N layers standard."""
        return dataclasses.replace(self.args, residual=residual).layer_layouts()

    def layout_args(self, layout: str, tp: int) -> ModelArgs:
        """The ModelArgs of this shape as ``layout`` served at TP ``tp``: standard, parallel, ladder; ``desync-K``
        built for ``tp`` (``option_errors.layout_fields``); ``desync``: the shape's own desync fields (a saved
        model's), which must be built for ``tp``. A desync model's TP 1 emulation is not predicted."""
        if layout == "desync":
            args = dataclasses.replace(self.args, residual="desync")
        else:
            args = dataclasses.replace(self.args, **layout_fields(layout, tp))
        if args.residual == "desync" and (args.desync_tp != tp or tp < 2):
            raise InputError(
                f"{self.name}: a desync model built for TP {args.desync_tp} is not predicted at TP {tp} "
                "(it runs at its own degree; its TP 1 emulation is not modelled)"
            )
        return args


def shape_from_fields(name: str, fields: dict, tied: bool, origin: str) -> Shape:
    """A Shape from ModelArgs-named fields (others are ignored); ``origin`` names the file or row in errors. The sizes
    and the numbers are checked as a model folder's are (``model/shape_checks.check_model_fields``: the check
    ladder-bench's ``--set`` meets too), the hybrid layer counts against n_layers."""
    check_model_fields({k: fields[k] for k in CHECKED_FIELDS if fields.get(k) is not None}, origin)
    kv = fields.get("n_kv_heads") or fields["n_heads"]
    ladder_layers = fields.get("ladder_layers")
    if ladder_layers is not None and not 0 <= ladder_layers <= fields["n_layers"]:
        raise InputError(f"{origin}: ladder_layers={ladder_layers} not in 0..n_layers={fields['n_layers']}")
    desync_layers = fields.get("desync_layers")
    if desync_layers is not None and not 0 <= desync_layers <= fields["n_layers"]:
        raise InputError(f"{origin}: desync_layers={desync_layers} not in 0..n_layers={fields['n_layers']}")
    kept = {k: v for k, v in fields.items() if k in _ARG_FIELDS and k not in ("residual", "tie_embeddings")}
    return Shape(name, ModelArgs(**{**kept, "n_kv_heads": kv, "ladder_layers": ladder_layers, "tie_embeddings": tied}))


TIME_NEUTRAL = ("max_seq_len", "rope_theta", "norm_eps", "init_std")  # ModelArgs fields that cost nothing
CHECKED_FIELDS = (*SIZE_FIELDS, *FLOAT_FIELDS)  # a shape's sizes and numbers, checked whatever their cost
SHAPE_FIELDS = ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "ladder_layers", "desync_layers")


def resolve_shape(source: str, ladder_layers: int | None = None, overrides: dict | None = None) -> Shape:
    """A preset of ``ladder_train.model.presets`` (tied head), a ``llama-*`` name (untied), or a path to a
    Hugging Face ``config.json`` or its folder (``tie_word_embeddings`` as given). ``overrides``: shape fields to
    replace (as ladder-bench's)."""
    from ..model.presets import PRESETS

    neutral = {k: v for k, v in (overrides or {}).items() if k in TIME_NEUTRAL}  # checked, then left out
    extra = {k: v for k, v in (overrides or {}).items() if k not in TIME_NEUTRAL}
    for key in extra:
        if key not in SHAPE_FIELDS:
            raise OptionError(
                "{overrides} {key}: not a shape field (one of {known})", key=key, known=", ".join(SHAPE_FIELDS)
            )
    if ladder_layers is not None:
        extra["ladder_layers"] = ladder_layers
    name = source
    if extra:
        name += ":" + ",".join(f"{k}={v}" for k, v in extra.items())
    if source in PRESETS:
        check_model_fields({**PRESETS[source], **neutral}, f"preset {source}")
        return shape_from_fields(name, {**PRESETS[source], **extra}, True, f"preset {source}")
    if source in LLAMA_SHAPES:
        fields = {"vocab_size": LLAMA_VOCAB, **LLAMA_SHAPES[source]}
        check_model_fields({**fields, "tie_embeddings": False, **neutral}, source)
        return shape_from_fields(name, {**fields, **extra}, False, source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        known = ", ".join([*PRESETS, *LLAMA_SHAPES])
        raise OptionError(
            "{model} {source!r}: neither a known shape ({known}) nor a config.json file or folder",
            source=source,
            known=known,
        )
    args = _hf_args(path)
    check_model_fields({**{key: getattr(args, key) for key in CHECKED_FIELDS}, **neutral}, str(path))
    fields = {key: getattr(args, key) for key in SHAPE_FIELDS}
    fields["ladder_layers"] = args.ladder_layers if args.residual == "ladder" else None
    label = path.parent.name or str(path)
    return shape_from_fields(label + name[len(source) :], {**fields, **extra}, args.tie_embeddings, str(path))


def _hf_args(path: Path) -> ModelArgs:
    """The ModelArgs of a config.json, or an InputError of one line naming the file."""
    config = read_json_object(path)
    try:
        return args_from_hf_config(config)
    except KeyError as err:
        raise InputError(f"{path}: missing key {err.args[0]}") from None
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
