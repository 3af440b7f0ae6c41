"""The transformers configuration of a Ladder Residual Llama (arXiv 2501.06589): a ``LlamaConfig`` plus the
residual layout (and a desync model's TP degree and reduce pattern). Imports only transformers, so it also runs from an export folder with ``trust_remote_code``.

Its fields are checked as ladder-train's own loader checks a config.json (``ladder_train/model/shape_checks.py``),
with the same limits and the same one-line messages, as a ValueError: a crafted or mistyped config.json (a string
size, a negative epsilon, a fractional ``ladder_layers``) is refused by name instead of building a model that
computes NaN or failing deep inside it. This file travels alone into exports, so the checks are written out here;
tests/test_hf.py holds both to the same verdicts (the desync fields: ``ladder_train/model/desync.py``).
"""

from transformers import LlamaConfig

RESIDUAL_LAYOUTS = ("standard", "parallel", "ladder", "desync")
# what a desync layer all-reduces, per layer of an explicit desync_pattern (model/desync.py's LAYER_REDUCES)
LAYER_REDUCES = {"none": (False, False), "attention": (True, False), "mlp": (False, True), "both": (True, True)}
DESYNC_FIELDS = ("desync_tp", "desync_reduce_every", "desync_pattern", "desync_layers")

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
CHECKED_FIELDS = (
    *SIZE_FIELDS,
    *POSITIVE_NUMBER_FIELDS,
    "tie_word_embeddings",
    "residual",
    "ladder_layers",
    *DESYNC_FIELDS,
)


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
    desync = _desync_problem(values)
    if desync:
        return desync
    if None in (dim, heads, layers, values.get("vocab_size"), values.get("intermediate_size")):
        return None  # the totals need every size
    return _size_problem(values)


def _desync_problem(values: dict) -> str | None:
    """The desync fields (ModelArgs.desync_field_problems, on config.json's names), once the sizes are sound."""
    residual = values.get("residual", "ladder")
    if residual != "desync":
        for name in ("desync_tp", "desync_layers", "desync_pattern"):
            if values.get(name) is not None:
                return f"{name}={values[name]!r}: only a desync model has it (null for residual={residual!r})"
        return None
    t, heads, layers = values.get("desync_tp"), values.get("num_attention_heads"), values.get("num_hidden_layers")
    if not _is_int(t) or t < 2:
        return f"desync_tp={t!r}: a desync model needs the tensor-parallel degree it is built for, an integer >= 2"
    for name in ("num_attention_heads", "intermediate_size"):
        if values.get(name) is not None and values[name] % t:
            return f"desync_tp={t}: does not divide {name}={values[name]}"
    kv = values.get("num_key_value_heads") or heads
    if kv is not None and ((t <= kv and kv % t) or (t > kv and t % kv)):
        return f"desync_tp={t}: neither divides nor is a multiple of num_key_value_heads={kv}"
    every = values.get("desync_reduce_every", 2)
    if not _is_int(every) or every < 1:
        return f"desync_reduce_every={every!r}: must be an integer >= 1 (2 = each MLP reduces)"
    n = layers if values.get("desync_layers") is None else values["desync_layers"]
    if not _is_int(n) or not 0 <= n <= (layers or 0):
        return f"desync_layers={n!r}: must be an integer in [0, num_hidden_layers={layers}]"
    pattern = values.get("desync_pattern")
    if pattern is not None:
        if not isinstance(pattern, (list, tuple)) or len(pattern) != n:
            return f"desync_pattern={pattern!r:.80}: must list one entry per desync layer ({n})"
        bad = [p for p in pattern if not isinstance(p, str) or p not in LAYER_REDUCES]
        if bad:
            return f"desync_pattern: {bad[0]!r} is not one of {', '.join(LAYER_REDUCES)}"
    return None


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
    """``residual``: standard | parallel | ladder | desync. ``ladder_layers`` (ladder only): the last N layers are
    ladder layers and the first L - N standard (a hybrid, as a converted pretrained Llama); None = every layer.
    Desync only: ``desync_tp`` the TP degree t whose t rank-local residual streams the model computes;
    ``desync_reduce_every`` k: every k-th module of the desync layers re-synchronises them (attention, MLP, ...
    counted from 1; 2 = each MLP), unless ``desync_pattern`` names per desync layer none | attention | mlp | both;
    the last module always does; ``desync_layers``: the last N layers are desync, the rest standard; None = all."""

    model_type = "ladder_llama"

    residual: str = "ladder"
    ladder_layers: int | None = None
    desync_tp: int | None = None
    desync_reduce_every: int = 2
    desync_pattern: list | None = None
    desync_layers: int | None = None

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
        if self.residual == "desync":
            # Llama's plan shards each module's heads and columns across ranks; a desync model already computes its
            # t rank-local streams through those slices on every device, so transformers' TP would slice them again.
            # No plan: under a distributed load every weight is replicated (the model's own plan drops the head too,
            # which shares its Parameter with the embedding), which computes the same function.
            self.base_model_tp_plan = {}

    def layer_layouts(self) -> list[str]:
        """The layout of each layer, first to last: a hybrid ladder or desync keeps its first L - N layers standard."""
        if self.residual not in ("ladder", "desync"):
            return [self.residual] * self.num_hidden_layers
        hybrid = self.ladder_layers if self.residual == "ladder" else self.desync_layers
        n_upper = self.num_hidden_layers if hybrid is None else hybrid
        return ["standard"] * (self.num_hidden_layers - n_upper) + [self.residual] * n_upper

    def cache_key_value_heads(self) -> list[int]:
        """The KV heads each layer's cache holds, first layer to last. A desync layer above ``num_key_value_heads``
        (t > n_kv) keeps one copy of a KV head per stream, t in all: the streams' keys differ, so the copies cannot
        be shared. A static cache sized before the first forward, a paged cache or a serving engine must size by
        this, not by ``num_key_value_heads`` (which stays the weights' head count, as in a Llama of the same
        shape); the attention refuses a cache sized otherwise."""
        n_kv = self.num_key_value_heads or self.num_attention_heads
        return [max(n_kv, self.desync_tp) if layout == "desync" else n_kv for layout in self.layer_layouts()]

    def layer_reduces(self) -> list[tuple[bool, bool]]:
        """(attention re-synchronises, MLP re-synchronises) per layer: always in a standard layer; in the desync
        layers as ``desync_pattern`` or else ``desync_reduce_every`` says, the last module always."""
        layouts = self.layer_layouts()
        n = layouts.count("desync")
        every = self.desync_reduce_every
        if self.desync_pattern is not None:
            schedule = [LAYER_REDUCES[p] for p in self.desync_pattern]
        else:
            schedule = [((2 * i + 1) % every == 0, (2 * i + 2) % every == 0) for i in range(n)]
        if schedule:
            schedule[-1] = (schedule[-1][0], True)  # the final norm and the head see one stream
        return [(True, True)] * (len(layouts) - n) + schedule


__all__ = ["LadderLlamaConfig"]
