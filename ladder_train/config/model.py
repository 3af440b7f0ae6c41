"""``model.*``: the model's own fields (``ModelArgs`` in model/transformer.py documents each one, with its choices and
ranges beside it) plus the preset they start from, and the rules among them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import ConfigError
from ..model import ModelArgs
from .schema import quote


@dataclass
class ModelConfig(ModelArgs):
    """``model.*``: the model's own fields plus the preset they start from."""

    preset: str | None = None  # a shape from presets.py (1.2B, 3.5B, 1.5B, 4.5B, 3.5B-32h, smollm2-135m, tiny, small)

    def __post_init__(self):
        pass  # the config keeps n_kv_heads=None ("= n_heads") as written; ModelArgs resolves it


def check_model(m: ModelConfig) -> None:
    """Positive sizes, heads that divide the width and an even head dim, the ladder and desync fields only where
    their layout is chosen."""
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim", "max_seq_len"):
        if getattr(m, name) <= 0:
            raise ConfigError(f"key 'model.{name}' must be positive, got {getattr(m, name)}")
    if m.dim % m.n_heads:
        raise ConfigError(f"key 'model.n_heads'={m.n_heads} does not divide model.dim={m.dim}")
    if (m.dim // m.n_heads) % 2:
        raise ConfigError(
            f"head dim model.dim / model.n_heads = {m.dim // m.n_heads} must be even for rotary embeddings"
        )
    kv_heads = m.n_kv_heads if m.n_kv_heads is not None else m.n_heads
    if kv_heads <= 0 or m.n_heads % kv_heads:
        raise ConfigError(
            f"key 'model.n_kv_heads'={m.n_kv_heads} must be positive and divide model.n_heads={m.n_heads}"
        )
    if m.ladder_layers is not None:
        if m.residual != "ladder":
            raise ConfigError(f"key 'model.ladder_layers' is set but model.residual is {m.residual!r}, not 'ladder'")
        if not 0 <= m.ladder_layers <= m.n_layers:
            raise ConfigError(
                f"key 'model.ladder_layers'={m.ladder_layers} must lie in [0, model.n_layers={m.n_layers}]"
            )
    for message in m.desync_field_problems(lambda field: f"key 'model.{field}'"):
        raise ConfigError(message)
    every = next(f.default for f in dataclasses.fields(m) if f.name == "desync_reduce_every")
    if m.residual != "desync" and m.desync_reduce_every != every:
        raise ConfigError(
            f"key 'model.desync_reduce_every'={quote(m.desync_reduce_every)}: only a desync model has it (leave it at "
            f"{every} for model.residual={m.residual!r})"
        )
