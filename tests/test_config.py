"""Recipes, overrides, presets and the one-line errors of the typed config."""

from pathlib import Path

import pytest

from ladder_train.cli import main as cli_main
from ladder_train.config import ConfigError, load_config, model_args, save_config

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_preset_recipe_then_overrides(tmp_path):
    write(tmp_path, "base.yaml", "model:\n  preset: 1.2B\n  residual: parallel\ntrain:\n  log_every: 5\n")
    recipe = write(tmp_path, "r.yaml", "defaults: [base.yaml]\nmodel:\n  residual: ladder\n  n_layers: 52\n")
    cfg = load_config(recipe, ["model.ladder_layers=16", "run.name=x"])
    assert (cfg.model.dim, cfg.model.n_heads, cfg.model.ffn_dim) == (1536, 24, 4096)  # from the preset
    assert cfg.model.n_layers == 52  # recipe beats preset
    assert cfg.model.residual == "ladder"  # recipe beats its base
    assert cfg.model.ladder_layers == 16 and cfg.train.log_every == 5
    assert cfg.run.dir == "runs/x"  # interpolation resolved
    args = model_args(cfg.model)
    assert args.layer_layouts()[:36] == ["standard"] * 36 and args.layer_layouts()[36:] == ["ladder"] * 16


def test_resolved_config_saves_and_reloads(tmp_path):
    cfg = load_config(
        None, ["model.preset=tiny", "model.residual=ladder", "data.seq_len=128", "train.optimizer.lr=1e-3"]
    )
    save_config(cfg, tmp_path / "run" / "config.yaml")
    again = load_config(tmp_path / "run" / "config.yaml")
    assert again == cfg


def test_misspelled_key_names_it_and_lists_valid_keys(tmp_path):
    recipe = write(tmp_path, "r.yaml", "model:\n  n_layer: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(recipe)
    message = str(err.value)
    assert "r.yaml" in message and "'model.n_layer'" in message and "did you mean 'n_layers'" in message
    assert "n_heads" in message and "\n" not in message


def test_unknown_section_lists_sections():
    with pytest.raises(
        ConfigError, match=r"unknown key 'trian' \(did you mean 'train'\?\); valid keys here: run, model, data, train"
    ):
        load_config(None, ["trian.log_every=3"])


def test_wrong_type_names_key_and_expected_type():
    with pytest.raises(ConfigError, match=r"key 'model.n_layers' expects int, got 'four'"):
        load_config(None, ["model.n_layers=four"])


def test_heads_not_dividing_hidden_size():
    with pytest.raises(ConfigError, match=r"'model.n_heads'=7 does not divide model.dim=1536"):
        load_config(None, ["model.n_heads=7"])


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("model.residual=sideways", r"'model.residual' must be one of standard, parallel, ladder"),
        ("model.preset=9B", r"'model.preset' is '9B'; available: 1.2B"),
        ("model.ladder_layers=3", r"'model.ladder_layers' is set but model.residual is 'standard'"),
        ("train.micro_batch_size=3", r"'train.micro_batch_size'=3 does not divide"),
        ("data.seq_len=4096", r"'data.seq_len'=4096 exceeds model.max_seq_len=2048"),
        ("model.n_kv_heads=5", r"'model.n_kv_heads'=5 must be positive and divide"),
        ("nonsense", r"not of the form key=value"),
        # the settings an H200 refused (a crash, a 3.5x slower step) are gone: named as unknown keys
        ("parallel.compile_wrapper=cpp", r"unknown key 'parallel.compile_wrapper'"),
        ("parallel.cuda_graphs=true", r"unknown key 'parallel.cuda_graphs'"),
    ],
)
def test_impossible_values(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, [override])


def test_missing_recipe_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="recipe not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(write(tmp_path, "bad.yaml", "model: [unclosed\n"))


def test_cli_prints_one_line_error(capsys):
    assert cli_main(["show", "model.n_layer=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ladder-train: error: ") and "n_layers" in err


def test_cli_show_reports_preset_size(capsys):
    assert cli_main(["show", "model.preset=3.5B", "model.residual=ladder", "model.ladder_layers=16"]) == 0
    out = capsys.readouterr().out
    assert "3,510.8M total" in out and "24 standard + 16 ladder" in out


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads(recipe):
    cfg = load_config(recipe)
    assert cfg.model.residual in ("standard", "parallel", "ladder")


# a value other than its default for every field of a ladder model (the desync fields are for a desync model)
EVERY_MODEL_FIELD = """
model:
  vocab_size: 100
  dim: 64
  n_layers: 3
  n_heads: 4
  n_kv_heads: 2
  ffn_dim: 96
  max_seq_len: 128
  rope_theta: 5.0e+5
  norm_eps: 1.0e-6
  init_std: 0.01
  residual: ladder
  ladder_layers: 2
  tie_embeddings: false
  rope_scaling:
    {rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 64}
data:
  seq_len: 64
"""


def as_override(value) -> str:
    """``value`` as the right-hand side of a ``key=value`` override."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_every_model_field_reaches_the_model(tmp_path):
    """model.* is ModelArgs plus the preset: each field set in a recipe, or by its key=value override, arrives in
    model_args unchanged."""
    import dataclasses

    import yaml

    from ladder_train.config import ModelConfig, model_args
    from ladder_train.model import ModelArgs

    arg_fields = {f.name for f in dataclasses.fields(ModelArgs)}
    assert {f.name for f in dataclasses.fields(ModelConfig)} == arg_fields | {"preset"}
    recipe = write(tmp_path, "r.yaml", EVERY_MODEL_FIELD)
    values = yaml.safe_load(EVERY_MODEL_FIELD)["model"]
    expected = {**dataclasses.asdict(ModelArgs()), **values}
    assert dataclasses.asdict(model_args(load_config(recipe).model)) == expected
    overrides = [f"model.{k}={as_override(v)}" for k, v in values.items()]
    cfg = load_config(None, [*overrides, "data.seq_len=64"])
    assert dataclasses.asdict(model_args(cfg.model)) == expected
    # None = "as many kv heads as heads" stays None in the config (and in config.yaml), resolved by ModelArgs
    plain = load_config(None, ["model.n_heads=8", "model.dim=64"])
    assert plain.model.n_kv_heads is None and model_args(plain.model).n_kv_heads == 8


@pytest.mark.parametrize("key, value", [("train.log_every", 0), ("data.shuffle_buffer", -1), ("parallel.timeout_s", 0)])
def test_non_positive_intervals_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "recipes/smoke.yaml", [f"{key}={value}"])
    message = str(err.value)
    assert f"key '{key}'" in message and f"got {value}" in message and "\n" not in message


@pytest.mark.parametrize("recipe", ["paper.yaml", "ladder_3b.yaml", "standard_1b.yaml"])
def test_paper_recipes_stream_sample_100bt_shuffled(recipe):
    cfg = load_config(REPO / "recipes" / recipe)
    assert (cfg.data.source, cfg.data.hub_config) == ("HuggingFaceFW/fineweb-edu", "sample-100BT")
    tokens = cfg.train.schedule.total_steps * cfg.train.global_batch_size * cfg.data.seq_len
    assert 100e9 <= tokens <= 110e9  # about one pass over the 100B-token sample, not ten over sample-10BT
    assert cfg.data.shuffle_buffer >= 1000


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.max_steps=0", "train.max_steps"),
        ("train.max_steps=-5", "train.max_steps"),
        ("checkpoint.every=-1", "checkpoint.every"),
        ("eval.val_every=-1", "eval.val_every"),
        ("eval.every=-2", "eval.every"),
        ("data.num_workers=-1", "data.num_workers"),
        ("data.seq_len=0", "data.seq_len"),
        ("train.optimizer.lr=-1", "train.optimizer.lr"),
        ("train.optimizer.lr=nan", "train.optimizer.lr"),
        ("train.optimizer.eps=0", "train.optimizer.eps"),
        ("train.optimizer.weight_decay=-0.1", "train.optimizer.weight_decay"),
        ("train.optimizer.betas=[0.9,1.0]", "train.optimizer.betas"),
        ("eval.val_batches=0", "eval.val_batches"),
        ("eval.limit=0", "eval.limit"),
        ("parallel.ac_every=0", "parallel.ac_every"),
        ("model.norm_eps=0", "model.norm_eps"),
        ("train.schedule.total_tokens=0", "train.schedule.total_tokens"),
        # the ceilings and floors of what consumes them: poll() takes milliseconds in a C int, numpy no negative seed
        ("data.worker_timeout_s=2592000", "data.worker_timeout_s"),
        ("parallel.timeout_s=2592000", "parallel.timeout_s"),
        ("run.seed=-1", "run.seed"),
        ("parallel.dp_shard=0", "parallel.dp_shard"),
        ("parallel.dp_replicate=-2", "parallel.dp_replicate"),
        ("train.optimizer.weight_decay=inf", "train.optimizer.weight_decay"),
        ("train.optimizer.eps=inf", "train.optimizer.eps"),
        ("train.schedule.warmup_tokens=inf", "train.schedule.warmup_tokens"),
        ("model.init_std=inf", "model.init_std"),
        ("profile.wait=9223372036854775808", "profile.wait"),
        ("train.schedule.warmup_steps=-1", "train.schedule.warmup_steps"),
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=f"^key '{key}' must ") as caught:
        load_config(None, [override])
    assert "\n" not in str(caught.value)


def test_the_largest_timeouts_their_waits_take_stay_valid():
    cfg = load_config(None, ["data.worker_timeout_s=2147483", "parallel.timeout_s=2147483", "run.seed=0"])
    assert cfg.data.worker_timeout_s == cfg.parallel.timeout_s == 2147483


def test_every_number_has_a_range():
    """A numeric field carries its range (``bounded``) or is checked with the fields it depends on."""
    import dataclasses
    import typing

    from ladder_train.config import Config, field_rules

    ruled = {key for key, rule in field_rules(Config) if "check" in rule}
    spanning = {"model." + k for k in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim")}
    spanning |= {"model.max_seq_len", "model.ladder_layers", "model.desync_tp", "model.desync_reduce_every"}
    spanning |= {"model.desync_layers", "train.global_batch_size", "train.micro_batch_size", "train.log_every"}
    spanning |= {"train.freeze_layers", "train.schedule.warmup_steps", "train.schedule.total_steps"}
    spanning |= {"train.schedule.min_lr_ratio", "checkpoint.keep"}

    def numbers(cls, prefix=""):
        for f in dataclasses.fields(cls):
            kind = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(kind):
                yield from numbers(kind, f"{prefix}{f.name}.")
            elif kind in (int, float, int | None, float | None):
                yield prefix + f.name

    assert set(numbers(Config)) - ruled - spanning == set()


def test_a_learning_rate_of_zero_and_no_weight_decay_stay_valid():
    cfg = load_config(None, ["train.optimizer.lr=0", "train.optimizer.weight_decay=0", "train.optimizer.grad_clip=0"])
    assert cfg.train.optimizer.lr == 0 and cfg.train.max_steps is None


def test_each_fields_choices_and_range_sit_beside_the_field_and_are_checked():
    from ladder_train.config import Config, field_rules

    rules = dict(field_rules(Config))
    assert rules["model.residual"]["choices"] == ("standard", "parallel", "ladder", "desync")  # ModelArgs' own field
    assert rules["train.schedule.kind"]["choices"] == ("cosine", "wsd")  # a nested section
    assert rules["data.seq_len"]["check"][1] == "at least 1"
    assert "run.name" not in rules  # a free-form field has no rule
    with pytest.raises(ConfigError, match=r"^key 'train.spike.threshold' must be a finite number > 0 .*got -1.0$"):
        load_config(REPO / "recipes/smoke.yaml", ["train.spike.threshold=-1"])
    with pytest.raises(ConfigError, match=r"^key 'eval.mode' must be one of inprocess, slurm, got 'later'$"):
        load_config(REPO / "recipes/smoke.yaml", ["eval.mode=later"])
