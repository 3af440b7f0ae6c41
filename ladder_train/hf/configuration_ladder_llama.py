"""The transformers configuration of a Ladder Residual Llama (arXiv 2501.06589): a ``LlamaConfig`` plus the
residual layout. Imports only transformers, so it also runs from an export folder with ``trust_remote_code``.

Its fields are checked as ladder-train's own loader checks a config.json (``ladder_train/model/shape_checks.py``),
with the same limits and the same one-line messages, as a ValueError: a crafted or mistyped config.json (a string
size, a negative epsilon, a fractional ``ladder_layers``) is refused by name instead of building a model that
computes NaN or failing deep inside it. This file travels alone into exports, so the checks are written out here;
tests/test_hf.py holds both to the same verdicts.
"""

from transformers import LlamaConfig

RESIDUAL_LAYOUTS = ("standard", "parallel", "ladder")

# shape_checks' limits (tests/test_hf.py compares them): each size at most 2**24, layers at most 2**12, a tensor at
# most 2**34 elements, all parameters at most 2**40
MAX_SIZE = 2**24
MAX_LAYERS = 2**12
MAX_TENSOR_ELEMENTS = 2**34
MAX_PARAMETERS = 2**40
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
)
POSITIVE_NUMBER_FIELDS = ("rope_theta", "rms_norm_eps", "initializer_range")
CHECKED_FIELDS = (*SIZE_FIELDS, *POSITIVE_NUMBER_FIELDS, "tie_word_embeddings", "residual", "ladder_layers")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_number(value) -> bool:
    # finite and above zero; NaN fails both comparisons
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def field_problem(values: dict) -> str | None:
    """What is wrong with the fields in ``values`` (config.json names; absent ones are not checked), as
    shape_checks words it, or None."""
    for name in SIZE_FIELDS:
        value = values.get(name)
        bound = MAX_LAYERS if name == "num_hidden_layers" else MAX_SIZE
        if name in values and not (value is None and name == "num_key_value_heads"):
            if not _is_int(value) or not 0 < value <= bound:
                return f"{name}={value!r}: must be a positive integer, at most {bound:,}"
    for name in POSITIVE_NUMBER_FIELDS:
        if name in values and not _is_positive_number(values[name]):
            return f"{name}={values[name]!r}: must be a positive number"
    if not isinstance(values.get("tie_word_embeddings", True), bool):
        return f"tie_word_embeddings={values['tie_word_embeddings']!r}: must be true or false"
    residual = values.get("residual", "ladder")
    if not isinstance(residual, str) or residual not in RESIDUAL_LAYOUTS:
        return f"residual={residual!r}: must be one of {', '.join(RESIDUAL_LAYOUTS)}"
    return _shape_problem(values)


def _shape_problem(values: dict) -> str | None:
    """The sizes together, once every present one is a positive integer (shape_checks' ``_shape_problems``)."""
    dim, heads, layers = values.get("hidden_size"), values.get("num_attention_heads"), values.get("num_hidden_layers")
    if dim is not None and heads is not None:
        if dim % heads:
            return f"num_attention_heads={heads}: does not divide hidden_size={dim}"
        if (dim // heads) % 2:
            return (
                f"hidden_size / num_attention_heads = {dim // heads}: the head dimension must be even "
                "(rotary embeddings rotate pairs)"
            )
        kv_heads = values.get("num_key_value_heads") or heads
        if heads % kv_heads:
            return f"num_key_value_heads={kv_heads}: does not divide num_attention_heads={heads}"
    ladder = values.get("ladder_layers")
    if ladder is not None and values.get("residual", "ladder") != "ladder":
        return f"ladder_layers={ladder!r}: only a ladder has ladder layers (null for residual={values['residual']!r})"
    if ladder is not None and (not _is_int(ladder) or not 0 <= ladder <= (layers or 0)):
        return f"ladder_layers={ladder!r}: must be an integer in [0, num_hidden_layers={layers}]"
    if None in (dim, heads, layers, values.get("vocab_size"), values.get("intermediate_size")):
        return None  # the totals need every size
    return _size_problem(values)


def _size_problem(values: dict) -> str | None:
    """A tensor or a model too large to be real (shape_checks' limits)."""
    dim, heads = values["hidden_size"], values["num_attention_heads"]
    largest = {
        ("vocab_size", "hidden_size"): values["vocab_size"] * dim,
        ("intermediate_size", "hidden_size"): values["intermediate_size"] * dim,
        ("max_position_embeddings", "hidden_size"): values.get("max_position_embeddings", 2048) * (dim // heads),
    }
    for (a, b), elements in largest.items():
        if elements > MAX_TENSOR_ELEMENTS:
            return (
                f"{a}={values.get(a, 2048)} and {b}={dim} make a tensor of {elements:,} elements, more than 2**34 "
                "(64 GiB in fp32, 8 times the largest of any released model)"
            )
    kv_dim = (values.get("num_key_value_heads") or heads) * (dim // heads)
    per_layer = 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * values["intermediate_size"] + 2 * dim
    tied = values.get("tie_word_embeddings", False)
    total = values["vocab_size"] * dim * (1 if tied else 2) + values["num_hidden_layers"] * per_layer
    if total > MAX_PARAMETERS:
        return f"num_hidden_layers={values['num_hidden_layers']}: {total:,} parameters in all, more than 2**40"
    return None


def _raise_if_bad(values: dict) -> None:
    problem = field_problem(values)
    if problem:
        raise ValueError(problem)


class LadderLlamaConfig(LlamaConfig):
    """``residual``: standard | parallel | ladder. ``ladder_layers`` (ladder only): the last N layers are ladder
    layers and the first L - N standard (a hybrid, as a converted pretrained Llama); None = every layer."""

    model_type = "ladder_llama"

    residual: str = "ladder"
    ladder_layers: int | None = None

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        # config.json's values as written, before transformers' own type checks raise their non-ValueError errors
        rope = config_dict.get("rope_parameters")
        values = {**config_dict, **{k: v for k, v in kwargs.items() if k in CHECKED_FIELDS}}
        if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in values:
            values["rope_theta"] = rope["rope_theta"]
        _raise_if_bad({k: v for k, v in values.items() if k in CHECKED_FIELDS})
        return super().from_dict(config_dict, **kwargs)

    def __post_init__(self, **kwargs):
        # before LlamaConfig's own __post_init__, which divides by num_attention_heads
        values = {name: getattr(self, name) for name in CHECKED_FIELDS if hasattr(self, name)}
        if "rope_theta" in kwargs:
            values["rope_theta"] = kwargs["rope_theta"]
        _raise_if_bad(values)
        super().__post_init__(**kwargs)
        rope = self.rope_parameters if isinstance(self.rope_parameters, dict) else {}
        if "rope_theta" in rope:  # transformers 5 keeps rope_theta there
            _raise_if_bad({"rope_theta": rope["rope_theta"]})

    def layer_layouts(self) -> list[str]:
        """The layout of each layer, first to last."""
        if self.residual != "ladder":
            return [self.residual] * self.num_hidden_layers
        n_ladder = self.num_hidden_layers if self.ladder_layers is None else self.ladder_layers
        return ["standard"] * (self.num_hidden_layers - n_ladder) + ["ladder"] * n_ladder


__all__ = ["LadderLlamaConfig"]
