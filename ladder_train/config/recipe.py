"""The whole config (``Config``, a section per field) and how it is built: a recipe with its ``defaults``, the
preset it names, then the command line's ``key=value`` overrides, merged by OmegaConf over the typed defaults and
checked (``rules.check_values``) before anything runs; and how it is written back (YAML, a plain dict)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import ConfigError
from ..files import write_text
from ..model import PRESETS, ModelArgs
from .data import DataConfig
from .model import ModelConfig
from .rules import check_values
from .run import (
    CheckpointConfig,
    EvalConfig,
    ParallelConfig,
    ProfileConfig,
    RunConfig,
    TensorBoardConfig,
    WandbConfig,
)
from .schema import check_layer, check_override_text, check_recipe_text, convert_error, quote
from .train import TrainConfig


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """Read a recipe and the recipes it names in ``defaults``, merged base-first (untyped)."""
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'defaults' cycle through {' -> '.join(str(p) for p in seen)}")
    check_recipe_text(path, path.read_text(errors="replace"))
    try:
        raw = OmegaConf.load(path)
    except Exception as err:  # a YAML syntax error: show the file and the first line of the reason
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(raw).__name__}")
    bases = raw.pop("defaults", [])
    if isinstance(bases, str):
        bases = [bases]
    merged = OmegaConf.create({})
    for base in bases:
        merged = OmegaConf.merge(merged, _read_yaml(path.parent / str(base), seen + (path.resolve(),)))
    return OmegaConf.merge(merged, raw)


def _merge_typed(schema: DictConfig, layer: DictConfig, origin: str) -> DictConfig:
    try:
        return OmegaConf.merge(schema, layer)
    except OmegaConfBaseException as err:
        raise convert_error(err, origin, Config) from None
    except TypeError as err:  # a container of another kind that check_layer did not see (a preset's)
        raise ConfigError(f"{origin}: {err}") from None


def _merge_layers(schema: DictConfig, layers: list[tuple[str, DictConfig]]) -> DictConfig:
    """``schema`` with ``layers`` merged over it in order, in one merge (each merge deep-copies what it merges
    into: one per layer was half of load_config's time); layer by layer only to name the one that fails."""
    try:
        return OmegaConf.merge(schema, *(layer for _, layer in layers))
    except (OmegaConfBaseException, TypeError):
        pass
    merged = schema
    for origin, layer in layers:
        merged = _merge_typed(merged, layer, origin)
    return merged


@functools.cache
def _schema() -> DictConfig:
    """The typed defaults, built once per process: building them costs more than a merge, which copies them."""
    return OmegaConf.structured(Config)


def load_config(recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build the run's config: schema defaults, then the preset named by ``model.preset``, then the
    recipe (with its ``defaults``), then the command-line ``overrides``. Raises ConfigError."""
    layers: list[tuple[str, DictConfig]] = []
    if recipe is not None:
        layers.append((str(recipe), _read_yaml(Path(recipe))))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {quote(item)} is not of the form key=value (e.g. model.n_layers=4)")
        check_override_text(item)
        try:
            layers.append((f"override {quote(item)}", OmegaConf.from_dotlist([item])))
        except Exception as err:  # OmegaConf's or YAML's: the first line of the reason
            raise ConfigError(f"override {quote(item)}: {str(err).splitlines()[0]}") from None
    for origin, layer in layers:
        check_layer(OmegaConf.to_container(layer, resolve=False), Config, origin)

    # the preset goes under every layer: the last layer that names one decides (check_layer held its type)
    preset = None
    for _, layer in layers:
        if isinstance(layer.get("model"), DictConfig) and "preset" in layer.model:
            preset = layer.model.preset
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"key 'model.preset' is {preset!r}; available: {', '.join(PRESETS)}")
        layers.insert(0, (f"preset {preset}", OmegaConf.create({"model": PRESETS[preset]})))
    merged = _merge_layers(_schema(), layers)
    if merged.data.sources and not any("source" in layer.get("data", {}) for _, layer in layers):
        merged.data.source = None  # a mixture replaces the default data.source; one set explicitly is refused
    try:
        OmegaConf.resolve(merged)
        cfg: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise convert_error(err, str(recipe) if recipe else "config", Config) from None
    check_values(cfg)
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML: printed at start and saved as RUN_DIR/config.yaml."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: Config, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, to_yaml(cfg))  # never through a link planted in the run folder


def to_dict(cfg: Config) -> dict[str, Any]:
    """A plain nested dict (for wandb and JSON)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def model_args(model: ModelConfig) -> ModelArgs:
    """The ModelArgs the Transformer is built from: every field of ``model`` but the preset."""
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(ModelArgs)}
    # lists and mappings (desync_pattern, rope_scaling) as plain Python values: they go into JSON and checkpoints
    return ModelArgs(**{k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in fields.items()})
