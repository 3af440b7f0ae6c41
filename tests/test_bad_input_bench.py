"""ladder-bench's and ladder-predict's --set shapes: one line naming the culprit, exit 2, before any work. A
preset's ``--set`` values meet the same checks as a model folder's fields (model/shape_checks.py), the checks
ladder-train's config refuses them by."""

import pytest
from cli_errors import assert_bad_input

import ladder_train.bench.runner as bench_runner

BAD_SHAPES = [
    ("n_layers=0", "n_layers=0: must be a positive integer"),
    ("n_layers=-2", "n_layers=-2: must be a positive integer"),
    ("vocab_size=0", "vocab_size=0: must be a positive integer"),
    ("dim=0", "dim=0: must be a positive integer"),
    ("n_kv_heads=0", "n_kv_heads=0: must be a positive integer"),
    ("ffn_dim=0", "ffn_dim=0: must be a positive integer"),
    ("rope_theta=-1", "rope_theta=-1.0: must be a positive number"),
    ("norm_eps=-1", "norm_eps=-1.0: must be a positive number"),
    ("n_kv_heads=3", "n_kv_heads=3: does not divide n_heads=4"),
]


@pytest.mark.parametrize("item,named", BAD_SHAPES)
def test_bench_refuses_a_bad_set_shape_before_any_rank_runs(item, named, capsys, monkeypatch):
    def no_work(options):
        raise AssertionError("a rank ran")

    monkeypatch.setattr(bench_runner, "run_rank", no_work)
    argv = ["--model", "tiny", "--set", item, "--layouts", "standard", "--batch-sizes", "1", "--compile", "off"]
    assert_bad_input(
        "ladder-bench", [*argv, "--prompt-len", "4", "--gen-len", "2"], f"tiny: {named}", capsys, monkeypatch
    )


@pytest.mark.parametrize("item,key", [(i, i.partition("=")[0]) for i, _ in BAD_SHAPES[:-1]])
def test_ladder_train_refuses_the_same_shapes(item, key, capsys, monkeypatch):
    assert_bad_input("ladder-train", ["--dry-run", "model.preset=tiny", f"model.{item}"], key, capsys, monkeypatch)


@pytest.mark.parametrize("item,named", BAD_SHAPES)
def test_ladder_predict_refuses_the_same_shapes_with_the_same_check(item, named, capsys, monkeypatch):
    argv = ["--model", "tiny", "--set", item, "--tp", "1", "--batch-sizes", "1"]
    assert_bad_input("ladder-predict", argv, f"preset tiny: {named}", capsys, monkeypatch)
