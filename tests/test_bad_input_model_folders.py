"""A FIFO where a file of a training checkpoint or a model folder belongs (its .distcp data, the file holding its trainer
entry, MANIFEST.json; an export's model.safetensors or config.json): every command that opens one (ladder-generate,
ladder-eval, ladder-export, ladder-bench --model, a run's checkpoint.init_from and resume) refuses it in one line naming
the file, exit 2, without opening it: a reader that opened it would wait for a writer for ever. ``planted_fifo`` lets
such a reader through at once, so a regression fails here instead of hanging. A manifest that lists a file outside its
folder is a damaged checkpoint: nothing outside is read."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from cli_errors import assert_bad_input, planted_fifo, run_cli
from dist_utils import save_training_checkpoint

from ladder_train.checkpoint import MANIFEST, CheckpointError, verify_checkpoint
from ladder_train.data.tokenizer import byte_tokenizer
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
SMOKE = Path(__file__).resolve().parent.parent / "recipes" / "smoke.yaml"
TINY = ModelArgs(vocab_size=257, dim=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=64)

# each command as a user runs it on MODEL (a checkpoint or a model folder), writing under TMP
COMMANDS = {
    "ladder-generate": lambda model, tmp: ["ladder-generate", model, "--prompt", "x"],
    "ladder-eval": lambda model, tmp: ["ladder-eval", model],
    "ladder-export": lambda model, tmp: ["ladder-export", model, tmp / "out"],
    "ladder-bench": lambda model, tmp: ["ladder-bench", "--model", model, "--prompt-len", "4", "--gen-len", "4"],
    "init_from": lambda model, tmp: [
        "ladder-train",
        "--config",
        SMOKE,
        f"checkpoint.init_from={model}",
        f"run.dir={tmp}",
    ],
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """The tiny model as a training checkpoint (with its manifest) and as an export folder with a tokenizer."""
    torch.manual_seed(0)
    model = Transformer(TINY)
    root = tmp_path_factory.mktemp("model_folders")
    checkpoint = save_training_checkpoint(model, root / "run", step=3)
    export = save_export(model, root / "export")
    byte_tokenizer().save(str(export / "tokenizer.json"))
    return {"checkpoint": checkpoint, "export": export}


def copy_of(saved: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    folder = tmp_path / "run" / "checkpoints" / "step-3" if kind == "checkpoint" else tmp_path / "model"
    shutil.copytree(saved[kind], folder)
    return folder


def refused(command: str, folder: Path, fifo: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """``command`` on ``folder`` exits 2 with one line naming the FIFO, which nothing opened."""
    prog, *argv = COMMANDS[command](folder, tmp_path / "work")
    with planted_fifo(fifo) as seen:
        assert_bad_input(prog, [str(a) for a in argv], f"{fifo}: a FIFO (named pipe)", capsys, monkeypatch)
    assert not seen["opened"], f"{command} opened {fifo}"


def trainer_entry_file(checkpoint: Path) -> str:
    """The data file ``.metadata`` says holds the trainer entry."""
    storage = dcp.FileSystemReader(str(checkpoint)).read_metadata().storage_data
    return next(info.relative_path for index, info in storage.items() if index.fqn == "trainer")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", ["__0_0.distcp", MANIFEST])
def test_a_fifo_in_a_checkpoint_is_refused_by_its_manifest_check_before_any_read(
    saved, tmp_path, capsys, monkeypatch, name, command
):
    checkpoint = copy_of(saved, "checkpoint", tmp_path)
    refused(command, checkpoint, checkpoint / name, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fifo_holding_the_trainer_entry_of_a_checkpoint_without_manifest_is_refused(
    saved, tmp_path, capsys, monkeypatch, command
):
    """A checkpoint written before manifests existed loads unverified (a note says so): its reader checks each file
    ``.metadata`` names before DCP opens any."""
    checkpoint = copy_of(saved, "checkpoint", tmp_path)
    (checkpoint / MANIFEST).unlink()
    fifo = checkpoint / trainer_entry_file(checkpoint)
    prog, *argv = COMMANDS[command](checkpoint, tmp_path / "work")
    with planted_fifo(fifo) as seen:
        status, _, err = run_cli(prog, [str(a) for a in argv], capsys, monkeypatch)
    assert not seen["opened"], f"{command} opened {fifo}"
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"{prog}: error: ")]
    assert status == 2 and len(errors) == 1 and f"{fifo}: a FIFO (named pipe)" in errors[0], err
    assert all(line in errors or line.startswith(f"note: {checkpoint} has no {MANIFEST}") for line in lines), err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_in_a_model_folder_is_refused_before_any_read(saved, tmp_path, capsys, monkeypatch, name, command):
    folder = copy_of(saved, "export", tmp_path)
    refused(command, folder, folder / name, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("command", ["ladder-generate", "ladder-eval", "ladder-export"])
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_fifo_where_a_model_folders_tokenizer_file_belongs_is_refused(
    saved, tmp_path, capsys, monkeypatch, name, command
):
    """The commands that read a folder's tokenizer files (ladder-bench and a training start read none)."""
    folder = copy_of(saved, "export", tmp_path)
    refused(command, folder, folder / name, tmp_path, capsys, monkeypatch)


@pytest.mark.slow  # the trainer starts its data loader's worker before it resumes
@pytest.mark.parametrize("name", ["__0_0.distcp", MANIFEST])
def test_resuming_from_a_checkpoint_with_a_fifo_is_refused_before_any_read(saved, tmp_path, capsys, monkeypatch, name):
    checkpoint = copy_of(saved, "checkpoint", tmp_path)
    fifo = checkpoint / name
    argv = ["--config", str(SMOKE), f"checkpoint.load={checkpoint}", f"run.dir={tmp_path / 'resumed'}"]
    with planted_fifo(fifo) as seen:
        status, _, err = run_cli("ladder-train", argv, capsys, monkeypatch)
    assert not seen["opened"], f"resume opened {fifo}"
    errors = [line for line in err.splitlines() if line.startswith("ladder-train: error: ")]
    assert status == 2 and len(errors) == 1 and f"{fifo}: a FIFO (named pipe)" in errors[0], err


def test_a_manifest_listing_a_file_outside_its_checkpoint_is_refused_as_damaged(saved, tmp_path):
    checkpoint = copy_of(saved, "checkpoint", tmp_path)
    (tmp_path / "outside").write_bytes(b"not the checkpoint's")
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    digest = hashlib.sha256(b"not the checkpoint's").hexdigest()
    manifest["files"]["../../../outside"] = {"bytes": 20, "sha256": digest}  # it would match, were it read
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"MANIFEST.json lists '\.\./\.\./\.\./outside', not a file name inside"):
        verify_checkpoint(checkpoint, no_dist=True)
