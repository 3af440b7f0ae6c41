"""A checkpoint write that runs out of room (no space: ENOSPC, a file over the size limit: EFBIG) ends the run with one
line naming the checkpoint and the OS error, exit 1; the cut ``step-N.partial`` is removed and the previous checkpoint
stays whole. The errors come from inside DCP's own writer, wrapped as DCP wraps them (``CheckpointException``)."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint.filesystem as dcp_files
from cli_errors import run_cli

from ladder_train.checkpoint import Checkpointer, CheckpointError, verify_checkpoint
from ladder_train.config import load_config
from ladder_train.model import ModelArgs, Transformer

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")
NO_SPACE = "OSError: [Errno 28] No space left on device (ENOSPC)"


def _tiny(folder: Path, async_save: bool = False):
    cfg = load_config(None, [f"checkpoint.async_save={str(async_save).lower()}"])
    model = Transformer(ModelArgs(vocab_size=64, dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_seq_len=16))
    return Checkpointer(cfg.checkpoint, folder, rank=0, world_size=1), model, torch.optim.AdamW(model.parameters())


def _disk_fills_in(monkeypatch, folder_name: str) -> None:
    """DCP's writer writes its bytes into a file of ``folder_name``, then finds the disk full."""
    write_item = dcp_files._write_item

    def write_then_fail(transforms, stream, *args, **kwargs):
        result = write_item(transforms, stream, *args, **kwargs)
        if folder_name in str(getattr(stream, "name", "")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return result

    monkeypatch.setattr(dcp_files, "_write_item", write_then_fail)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_removes_the_partial_checkpoint_and_keeps_the_previous(tmp_path, monkeypatch, async_save):
    checkpointer, model, optimizer = _tiny(tmp_path, async_save)
    kept = checkpointer.save(1, model, optimizer, {"step": 1}, {})
    checkpointer.finish()
    files_before = {p.name: p.read_bytes() for p in kept.iterdir()}
    _disk_fills_in(monkeypatch, "step-2.partial")
    with pytest.raises(CheckpointError) as refused:
        checkpointer.save(2, model, optimizer, {"step": 2}, {})
        checkpointer.finish()  # a background save fails here
    partial = tmp_path / "checkpoints" / "step-2.partial"
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"writing {partial} failed ({NO_SPACE}), the partial checkpoint is removed: ")
    assert message.endswith(f"free on its file system; free space, then rerun to resume from {kept}")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == files_before
    verify_checkpoint(kept)


def test_a_full_disk_while_training_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    argv = ["--config", SMOKE, f"run.dir={run}", "train.max_steps=2", "checkpoint.every=1", "data.num_workers=0"]
    _disk_fills_in(monkeypatch, "step-2.partial")
    status, _, err = run_cli("ladder-train", argv, capsys, monkeypatch)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 1, err
    assert len(lines) == 1, err
    partial = run / "checkpoints" / "step-2.partial"
    assert lines[0].startswith(f"ladder-train: error: writing {partial} failed ({NO_SPACE}), the partial checkpoint")
    assert lines[0].endswith(f"then rerun to resume from {run / 'checkpoints' / 'step-1'}")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]
    verify_checkpoint(run / "checkpoints" / "step-1")


# the second save meets a file-size limit (RLIMIT_FSIZE) set after the first: every file write over it fails with
# EFBIG once SIGXFSZ, which would kill the process, is ignored
_EFBIG_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys, warnings
    from pathlib import Path
    warnings.filterwarnings("ignore", "torch.distributed is disabled")  # a trainer has a process group; this not
    sys.path.insert(0, sys.argv[2])
    from test_checkpoint_disk_full import _tiny
    from ladder_train.cli import run_command

    def command(argv):
        checkpointer, model, optimizer = _tiny(Path(sys.argv[1]))
        checkpointer.save(1, model, optimizer, {"step": 1}, {})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        checkpointer.save(2, model, optimizer, {"step": 2}, {})

    sys.exit(run_command("ladder-train", command, []))
    """
)


@pytest.mark.slow
def test_a_file_size_limit_while_saving_is_one_line_and_exit_1(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _EFBIG_SCRIPT, str(tmp_path), str(REPO / "tests")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    partial = tmp_path / "checkpoints" / "step-2.partial"
    assert lines[0].startswith(
        f"ladder-train: error: writing {partial} failed (OSError: [Errno 27] File too large (EFBIG)), the partial "
        "checkpoint is removed: a file outgrew the file-size limit (ulimit -f)"
    )
    assert lines[0].endswith(f"then rerun to resume from {tmp_path / 'checkpoints' / 'step-1'}")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]
    verify_checkpoint(tmp_path / "checkpoints" / "step-1")


def test_a_full_disk_while_the_manifest_is_written_removes_the_partial_too(tmp_path, monkeypatch):
    import ladder_train.checkpoint.checkpointer as checkpointer_module

    checkpointer, model, optimizer = _tiny(tmp_path)
    kept = checkpointer.save(1, model, optimizer, {"step": 1}, {})

    def manifest_fills_the_disk(folder):
        (Path(folder) / "MANIFEST.json").write_text("{")  # cut short
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(folder) / "MANIFEST.json"))

    monkeypatch.setattr(checkpointer_module, "write_manifest", manifest_fills_the_disk)
    with pytest.raises(CheckpointError) as refused:
        checkpointer.save(2, model, optimizer, {"step": 2}, {})
    partial = tmp_path / "checkpoints" / "step-2.partial"
    assert str(refused.value).startswith(f"writing {partial} failed (OSError: [Errno 28] No space left on device: ")
    assert str(refused.value).endswith(f"then rerun to resume from {kept}")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]
