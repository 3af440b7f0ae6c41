"""Typed run configuration: dataclasses checked by OmegaConf, one module per section.

A recipe is a YAML file (``recipes/*.yaml``) whose sections mirror :class:`Config`. A recipe may start
from others with ``defaults: [base.yaml, ...]`` (paths relative to the recipe; later ones win, the
recipe itself wins over all). Command-line overrides are OmegaConf dotlist items, ``model.n_layers=4``.

``model.preset`` names a shape from ``ladder_train/model/presets.py``; fields the recipe or the command
line set explicitly win over the preset's.

Everything is validated before any work starts: an unknown key, a wrong type or an impossible value
raises :class:`ConfigError` with a one-line message naming the key (and the valid keys or values).
A field's comment is its documentation; its choices (``choice``) or range (``bounded``) sit beside it.

- ``model.py``, ``data.py``, ``train.py``, ``run.py`` (run, parallel, checkpoint, wandb, eval, profile,
  tensorboard): the sections' dataclasses, each beside the rules among its own fields;
- ``schema.py``: the machinery every section uses (field rules, the shape and text of a layer, one-line errors);
- ``recipe.py``: ``Config``, recipe loading and ``key=value`` overrides, YAML and dict output;
- ``rules.py``: every check of a built config in order, and the rules that span sections.
"""

from ..errors import ConfigError
from .data import DataConfig, WeightedSource
from .model import ModelConfig
from .recipe import Config, load_config, model_args, save_config, to_dict, to_yaml
from .run import (
    CheckpointConfig,
    EvalConfig,
    ParallelConfig,
    ProfileConfig,
    RunConfig,
    TensorBoardConfig,
    WandbConfig,
)
from .schema import field_rules
from .train import OptimizerConfig, ScheduleConfig, SpikeConfig, TrainConfig, schedule_steps

__all__ = [
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "ProfileConfig",
    "RunConfig",
    "ScheduleConfig",
    "SpikeConfig",
    "TensorBoardConfig",
    "TrainConfig",
    "WandbConfig",
    "WeightedSource",
    "field_rules",
    "load_config",
    "model_args",
    "save_config",
    "schedule_steps",
    "to_dict",
    "to_yaml",
]
