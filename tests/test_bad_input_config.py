"""Bad config input that OmegaConf alone lets through or turns into a traceback: a mapping, list or scalar where the
schema wants another container, a bool field given a number, a control character in a value or a recipe, a desync
key on another layout, a whole file quoted in one line, flags that mean something only with ``--dry-run``. Each is
exit 2 and one line naming the key, file or flag (``cli_errors.assert_bad_input``), before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_errors import assert_bad_input, run_cli

from ladder_train.config import load_config

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")
DESYNC = ["model.residual=desync", "model.desync_tp=2"]


@pytest.mark.parametrize(
    "overrides, named",
    [
        ([*DESYNC, "model.desync_pattern={a:1}"], "key 'model.desync_pattern' expects list[str] or null, got {"),
        (["data.sources={a: 1}"], "key 'data.sources' expects list[WeightedSource], got {'a': 1}"),
        (["data.sources=[1]"], "key 'data.sources[0]' expects a mapping of the section's keys, got 1"),
        (["train.optimizer.betas={a: 1}"], "key 'train.optimizer.betas' expects list[float], got {'a': 1}"),
        (["train.optimizer=[1,2]"], "key 'train.optimizer' expects a mapping of the section's keys, got [1, 2]"),
        (["parallel=5"], "key 'parallel' expects a mapping of the section's keys, got 5"),
        (["model.rope_scaling=[1]"], "key 'model.rope_scaling' expects dict or null, got [1]"),
        (["run.name={a: 1}"], "key 'run.name' expects str, got {'a': 1}"),
        (["eval.tasks=[[a]]"], "key 'eval.tasks[0]' expects str, got ['a']"),
        (["parallel.compile=2"], "key 'parallel.compile' expects bool, got 2"),
        (["checkpoint.async_save=0"], "key 'checkpoint.async_save' expects bool, got 0"),
        (["wandb.project=c\x01d"], "key 'wandb.project' holds a control character '\\x01'"),
        (["run.name=a\x7fb"], "key 'run.name' holds a control character '\\x7f'"),
        (["model.residual=ladder", "model.desync_reduce_every=3"], "key 'model.desync_reduce_every'=3: only a desync"),
    ],
)
def test_an_override_of_the_wrong_shape_is_one_line_naming_the_key(capsys, monkeypatch, overrides, named):
    assert_bad_input("ladder-train", ["show", "--config", SMOKE, *overrides], named, capsys, monkeypatch)


@pytest.mark.parametrize(
    "text, named",
    [
        ("parallel: 5\n", "r.yaml: key 'parallel' expects a mapping of the section's keys, got 5"),
        ("data:\n  sources: {a: 1}\n", "r.yaml: key 'data.sources' expects list[WeightedSource], got {'a': 1}"),
        ("train:\n  optimizer: [1, 2]\n", "key 'train.optimizer' expects a mapping"),
        ("parallel:\n  compile: 2\n", "r.yaml: key 'parallel.compile' expects bool, got 2"),
        ("wandb:\n  project: 'c\x01d'\n", "r.yaml: line 2 (key 'project'): a control character '\\x01'"),
        ('wandb:\n  project: "c\\x01d"\n', "key 'wandb.project' holds a control character '\\x01'"),
        ("model:\n  residual: parallel\n  desync_layers: 2\n", "key 'model.desync_layers'=2: only a desync model"),
    ],
)
def test_a_recipe_of_the_wrong_shape_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, text, named):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    assert_bad_input("ladder-train", ["show", "--config", str(recipe)], named, capsys, monkeypatch)


def test_a_large_text_file_as_a_recipe_is_refused_without_quoting_all_of_it(tmp_path, capsys, monkeypatch):
    passwd = "\n".join(f"user{i}:x:{i}:{i}:User {i}:/home/user{i}:/bin/sh" for i in range(2500))  # ~100 KB
    line_per_key = "\n".join(f"key{i}: {'v' * 60}" for i in range(1500))
    for text, named in ((passwd, "unknown key 'user0:x:0:0:User 0"), (line_per_key, "unknown key 'key0'")):
        recipe = tmp_path / "big.yaml"
        recipe.write_text(text)
        status, _, err = run_cli("ladder-train", ["show", "--config", str(recipe)], capsys, monkeypatch)
        assert status == 2 and len(err.strip().splitlines()) == 1 and named in err, err[:300]
        assert len(err) < 400, f"{len(err)} characters: {err[:300]}"


def test_the_values_that_look_close_stay_valid():
    cfg = load_config(SMOKE, ["parallel.compile=false", "checkpoint.async_save=true", "wandb.project=tab-free name"])
    assert (cfg.parallel.compile, cfg.checkpoint.async_save) == (False, True)
    assert load_config(SMOKE, ["model.residual=ladder", "model.desync_reduce_every=2"]).model.residual == "ladder"
    desync = load_config(SMOKE, [*DESYNC, "model.desync_pattern=[none,both]", "model.desync_reduce_every=4"])
    assert desync.model.desync_pattern == ["none", "both"]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--gpu-memory", "40"], "--gpu-memory 40.0 only means something with --dry-run"),
        (["--simulate", "2x8"], "--simulate '2x8' only means something with --dry-run"),
        (["--json"], "--json only means something with --dry-run"),
        (["--dry-run", "--simulate", "0x8"], "--simulate '0x8': NODES and GPUS must be integers >= 1"),
        (["--dry-run", "--simulate", "2x"], "--simulate '2x' must look like NODESxGPUS"),
    ],
)
def test_flags_of_the_dry_run_are_refused_without_it_and_named(tmp_path, capsys, monkeypatch, flags, named):
    run = tmp_path / "run"
    argv = ["--config", SMOKE, f"run.dir={run}", "wandb.mode=disabled", *flags]
    assert_bad_input("ladder-train", argv, named, capsys, monkeypatch)
    assert not run.exists()  # refused before the trainer made its folder
