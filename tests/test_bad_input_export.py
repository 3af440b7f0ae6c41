"""ladder-export fed what a user may hand it: a folder that already holds files, a folder where the weights go, a run
folder instead of a checkpoint, names too long for the file system. Each is one line and exit 2 before any work,
and nothing a user wrote is replaced without --overwrite; the weights get the mode the umask gives."""

from __future__ import annotations

import errno
import os
import shutil

import pytest
import torch
from cli_errors import assert_bad_input, run_cli
from dist_utils import save_training_checkpoint

import ladder_train.export.writer as writer
from ladder_train.loading import load_model
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import INDEX_FILE

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
TINY = dict(vocab_size=257, dim=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=64, residual="ladder")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run with complete checkpoints step-3 and step-5 and an unfinished step-7."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**TINY))
    root = tmp_path_factory.mktemp("export_inputs") / "run"
    save_training_checkpoint(model, root, step=3)
    save_training_checkpoint(model, root, step=5)
    unfinished = root / "checkpoints" / "step-7"
    shutil.copytree(root / "checkpoints" / "step-5", unfinished)
    (unfinished / "COMPLETE").unlink()
    return root


def export_cli(argv, capsys, monkeypatch):
    return run_cli("ladder-export", [str(a) for a in argv], capsys, monkeypatch)


def another_models_folder(folder):
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"another model's weights")
    (folder / "config.json").write_text('{"model_type": "another"}\n')
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_a_folder_holding_files_is_refused_before_any_work(run_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    before = another_models_folder(out)

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read before OUT_DIR was checked")

    monkeypatch.setattr(writer, "model_from_checkpoint", no_work)
    checkpoint = run_dir / "checkpoints" / "step-5"
    assert_bad_input("ladder-export", [str(checkpoint), str(out)], "--overwrite", capsys, monkeypatch)
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    status, _, err = export_cli([checkpoint, out], capsys, monkeypatch)
    assert f"{out}: exists and is not empty (config.json, model.safetensors)" in err


def test_overwrite_replaces_the_exports_files_and_nothing_else(run_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    another_models_folder(out)
    (out / "tokenizer_config.json").write_text('{"eos_token": "<|stale|>"}')  # an earlier export's, now wrong
    (out / "NOTES.md").write_text("mine\n")
    (out / "eval").mkdir()
    (out / "eval" / "results.json").write_text("{}")
    checkpoint = run_dir / "checkpoints" / "step-5"
    status, _, err = export_cli([checkpoint, out, "--overwrite"], capsys, monkeypatch)
    assert status == 0, err
    assert (out / "NOTES.md").read_text() == "mine\n" and (out / "eval" / "results.json").read_text() == "{}"
    assert not (out / "tokenizer_config.json").exists()  # this export has no tokenizer: no stale one is left
    ids = torch.randint(0, 257, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(load_model(out)(ids), load_model(checkpoint)(ids), atol=0, rtol=0)


def test_a_folder_where_the_weights_go_is_one_line(run_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    (out / "model.safetensors").mkdir(parents=True)
    checkpoint = str(run_dir / "checkpoints" / "step-5")
    assert_bad_input("ladder-export", [checkpoint, str(out)], "not empty", capsys, monkeypatch)
    named = f"{out / 'model.safetensors'}: a folder is where the export writes its model.safetensors"
    assert_bad_input("ladder-export", [checkpoint, str(out), "--overwrite"], named, capsys, monkeypatch)
    # a link would have the weights written wherever it points
    shutil.rmtree(out / "model.safetensors")
    (out / "config.json").symlink_to(tmp_path / "elsewhere.json")
    named = f"{out / 'config.json'}: a symbolic link is where"
    assert_bad_input("ladder-export", [checkpoint, str(out), "--overwrite"], named, capsys, monkeypatch)


@pytest.mark.parametrize("name", ["model.safetensors", "README.md", "generation_config.json", "tokenizer.json"])
def test_a_link_planted_where_an_export_file_goes_is_refused_and_its_target_is_untouched(
    run_dir, tmp_path, capsys, monkeypatch, name
):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_bytes(b"someone's file\n")
    (out / name).symlink_to(victim)
    argv = [str(run_dir / "checkpoints" / "step-5"), str(out)]
    assert_bad_input("ladder-export", argv, "not empty", capsys, monkeypatch)
    named = f"{out / name}: a symbolic link is where the export writes its {name}"
    assert_bad_input("ladder-export", [*argv, "--overwrite"], named, capsys, monkeypatch)
    assert victim.read_bytes() == b"someone's file\n" and [p.name for p in out.iterdir()] == [name]


def test_a_shard_index_that_would_shadow_the_weights_is_refused(run_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / INDEX_FILE).write_text('{"weight_map": {}}')  # loaders read the shards it lists, not model.safetensors
    argv = [str(run_dir / "checkpoints" / "step-5"), str(out), "--overwrite"]
    assert_bad_input("ladder-export", argv, f"{out / INDEX_FILE}: a sharded model's index", capsys, monkeypatch)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_every_file_follows_the_umask_the_weights_too(run_dir, tmp_path, capsys, monkeypatch, umask, mode):
    previous = os.umask(umask)
    try:
        status, _, err = export_cli([run_dir / "checkpoints" / "step-5", tmp_path / "out"], capsys, monkeypatch)
    finally:
        os.umask(previous)
    assert status == 0, err
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "out").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {mode}, modes


def test_a_run_folder_names_its_checkpoints(run_dir, tmp_path, capsys, monkeypatch):
    # load_model reads only the folder it is given, never the newest of a run: the export names them instead
    newest = run_dir / "checkpoints" / "step-5"
    for source in (run_dir, run_dir / "checkpoints"):
        named = f"{source}: a run's folder, not a checkpoint: export one of its checkpoints, e.g. {newest}"
        assert_bad_input("ladder-export", [str(source), str(tmp_path / "out")], named, capsys, monkeypatch)
        _, _, err = export_cli([source, tmp_path / "out"], capsys, monkeypatch)
        assert "(complete: step-5, step-3; 1 incomplete)" in err
    assert not (tmp_path / "out").exists()
    unfinished = run_dir / "checkpoints" / "step-7"
    named = f"{unfinished}: not a complete checkpoint (no COMPLETE marker: its save never finished); the newest"
    assert_bad_input("ladder-export", [str(unfinished), str(tmp_path / "out")], named, capsys, monkeypatch)
    (tmp_path / "empty").mkdir()
    named = "neither a training checkpoint (RUN_DIR/checkpoints/step-N) nor a Hugging Face format folder"
    assert_bad_input("ladder-export", [str(tmp_path / "empty"), str(tmp_path / "out")], named, capsys, monkeypatch)


def test_names_too_long_for_the_file_system_are_one_line(run_dir, tmp_path, capsys, monkeypatch):
    checkpoint = str(run_dir / "checkpoints" / "step-5")
    long = "x" * 300
    for argv in (
        [checkpoint, str(tmp_path / long)],
        [checkpoint, str(tmp_path / long / "export")],
        [checkpoint, str(tmp_path / long), "--overwrite"],
        [str(tmp_path / long), str(tmp_path / "out")],
    ):
        assert_bad_input("ladder-export", argv, "File name too long", capsys, monkeypatch)
    # a folder the file system can make, whose files' paths are too long: safetensors raises its own error
    deep = tmp_path
    while len(str(deep / ("d" * 200))) < 4080:
        deep = deep / ("d" * 200)
    deep = deep / ("e" * (4086 - len(str(deep)) - 1))
    assert 4095 - len("/model.safetensors") < len(str(deep)) < 4095  # PATH_MAX is 4,096 with the final NUL
    assert_bad_input("ladder-export", [checkpoint, str(deep)], "File name too long", capsys, monkeypatch)


def test_os_failures_inside_safetensors_and_tokenizers_are_os_errors(tmp_path):
    from ladder_train.model.hf_format import os_error_of, save_weights

    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(IsADirectoryError) as raised:  # the console scripts print it in one line
        save_weights({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    assert raised.value.filename == str(tmp_path / "model.safetensors")
    err = os_error_of(Exception("Permission denied (os error 13)"), tmp_path / "tokenizer.json")
    assert isinstance(err, OSError) and err.errno == errno.EACCES
    other = ValueError("not an OS failure")
    assert os_error_of(other, tmp_path) is other
