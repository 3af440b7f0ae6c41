"""Damaged and crafted checkpoints: reading one never runs its code (pickled payloads, refused entries), checksums
and truncation named in one line with the previous complete checkpoint; on a smoke run that keeps every
checkpoint (checkpoint.keep=0)."""

import contextlib
import io
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_checkpoint import train

from ladder_train.checkpoint import MANIFEST, CheckpointError, read_trainer_state
from ladder_train.folders import COMPLETE_MARKER


def error_lines(stderr: str) -> list[str]:
    """ladder-train's error lines, without the program name (torchrun's workers may print other lines too)."""
    prefix = "ladder-train: "
    return [line.removeprefix(prefix) for line in stderr.splitlines() if line.startswith(f"{prefix}error:")]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    """A 4-step smoke run with checkpoint.keep=0 and a checkpoint every 2 steps: step-2 and step-4."""
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    result = train(run_dir, "train.max_steps=4", "checkpoint.keep=0")
    assert result.returncode == 0, result.stderr
    return run_dir


def copy_run(smoke_run: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(smoke_run, run_dir)
    return run_dir


@pytest.mark.slow
def test_keep_zero_keeps_every_checkpoint(smoke_run):
    names = sorted(p.name for p in (smoke_run / "checkpoints").iterdir())
    assert names == ["step-2", "step-4"]
    assert all((smoke_run / "checkpoints" / n / COMPLETE_MARKER).is_file() for n in names)


# reading a checkpoint never runs its code -------------------------------------------------------------------


class Payload:
    """Unpickling this calls open(path, 'w'): the file appears if a reader runs pickled code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def full_state(checkpoint: Path) -> dict:
    """Every entry of one of our own (trusted) checkpoints, nested as saved."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = checkpoint.parent / "full.pt"
    dcp_to_torch_save(str(checkpoint), str(target))
    state = torch.load(target, weights_only=False)
    target.unlink()
    return state


def rewrite(source: Path, dest: Path, **entries) -> None:
    """A copy of checkpoint ``source`` at ``dest`` with some entries replaced (no manifest)."""
    state = {**full_state(source), **entries}
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(dest)
    dcp.save(state, checkpoint_id=str(dest), no_dist=True)
    (dest / COMPLETE_MARKER).write_text("crafted\n")


def add_manifest(folder: Path) -> None:
    from ladder_train.checkpoint.integrity import write_manifest

    write_manifest(folder)  # the attacker can write matching checksums too


@pytest.mark.slow
def test_pickled_payloads_are_refused_without_running(smoke_run, tmp_path, export):
    run_dir = copy_run(smoke_run, tmp_path)
    good = run_dir / "checkpoints" / "step-4"
    marker = tmp_path / "pwned"
    inner = io.BytesIO()
    torch.save(Payload(marker), inner)
    crafted = {
        "trainer_object": {"trainer": Payload(marker)},  # unpickled by DCP's own planner
        "trainer_bytes": {"trainer": io.BytesIO(inner.getvalue())},  # unpickled by the entry decoder
        "rank_bytes": {"rank0": io.BytesIO(inner.getvalue())},
    }
    for name, entries in crafted.items():
        folder = tmp_path / name / "checkpoints" / "step-4"
        rewrite(good, folder, **entries)
        add_manifest(folder)
    # and a .metadata that is itself the payload
    metadata = tmp_path / "metadata" / "checkpoints" / "step-4"
    shutil.copytree(good, metadata)
    (metadata / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    add_manifest(metadata)

    refusals = {
        "trainer_object": "the trainer entry names ",
        "trainer_bytes": "the trainer entry names ",
        "metadata": ".metadata names io.open, which a checkpoint's metadata never holds",
    }
    for name, why in refusals.items():
        folder = tmp_path / name / "checkpoints" / "step-4"
        result = export(folder, tmp_path / f"export_{name}")
        assert not marker.exists(), f"{name}: the payload ran"
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"ladder-export: error: {folder}: refused to read it: {why}"), line
        assert "weights_only" not in line and "trusted" not in line  # never advice to turn the check off
        assert line.endswith("; the previous complete checkpoint is none")

    # resume: the rank entry (read last, after the weights) is refused too. The crafted checkpoint's trainer entry
    # says step 6 as its folder does (a step that disagrees with its folder is refused before anything is read).
    from ladder_train.checkpoint.safe_load import pack_json, read_trainer_state

    resumed = run_dir / "checkpoints" / "step-6"
    trainer = pack_json({**read_trainer_state(good), "step": 6})
    rewrite(good, resumed, rank0=io.BytesIO(inner.getvalue()), trainer=trainer)
    add_manifest(resumed)
    result = train(run_dir, "train.max_steps=8")
    assert not marker.exists()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = error_lines(result.stderr)
    assert "step-6: refused to read it: the rank0 entry names " in line and "weights_only" not in line
    assert line.endswith(f"the previous complete checkpoint is {run_dir / 'checkpoints' / 'step-4'}")


@pytest.mark.slow
def test_a_checkpoint_without_manifest_and_with_a_pickled_trainer_entry_resumes(smoke_run, tmp_path):
    """A trainer entry written by torch.save (read by the weights-only unpickler) and no manifest to verify."""
    from ladder_train.checkpoint.safe_load import pack

    run_dir = copy_run(smoke_run, tmp_path)
    step4 = run_dir / "checkpoints" / "step-4"
    trainer = read_trainer_state(step4)
    rewrite(step4, step4.with_name("step-4.new"), trainer=pack(trainer))
    shutil.rmtree(step4)
    step4.with_name("step-4.new").rename(step4)
    assert not (step4 / MANIFEST).exists()
    assert read_trainer_state(step4) == trainer

    result = train(run_dir, "train.max_steps=6")
    assert result.returncode == 0, result.stderr
    assert f"note: {step4} has no {MANIFEST} (no checksums to verify): loading it unverified" in result.stderr
    assert "resuming from" in result.stdout and "at step 4" in result.stdout


class _SystemCall:
    def __reduce__(self):
        return (os.system, ("echo ran",))


def _torch_saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "raw, expected",
    [
        (
            _torch_saved({"x": _SystemCall()}),
            "refused to read it: the trainer entry names posix.system, which a checkpoint never holds",
        ),
        (
            _torch_saved({"x": np.array([1, "a"], dtype=object)}),
            "refused to read it: the trainer entry names numpy.dtypes.ObjectDType, which a checkpoint never holds",
        ),
        (
            pickle.dumps(_SystemCall(), protocol=4),
            "cannot be read: the trainer entry is not plain data and tensors, or is damaged (Unsupported operand ",
        ),
        (b"\x80\x02garbage", "cannot be read: the trainer entry is not plain data and tensors, or is damaged ("),
    ],
    ids=["os.system", "numpy object array", "protocol-4 pickle", "garbage"],
)
def test_a_refused_entry_is_named_in_one_line_that_never_advises_turning_the_check_off(raw, expected):
    from ladder_train.checkpoint.safe_load import describe, unpack

    with pytest.raises(Exception) as caught:
        unpack(io.BytesIO(raw))
    line = describe(caught.value, "the trainer entry")
    assert line.startswith(expected), line
    assert "\n" not in line and "weights_only" not in line and "trusted source" not in line


def test_metadata_cannot_set_attributes_on_an_allowed_class():
    """BUILD with a (state, slotstate) pair would setattr on the class itself: refused, the class unchanged."""
    import torch.distributed.checkpoint.metadata as dcp_metadata

    from ladder_train.checkpoint.safe_load import _MetadataUnpickler, describe

    payload = (
        b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n"  # GLOBAL: an allowed record class
        b"N}X\x05\x00\x00\x00pwnedK\x01s\x86b."  # (None, {"pwned": 1}), BUILD on the class, STOP
    )
    with pytest.raises(Exception) as caught:
        _MetadataUnpickler(io.BytesIO(payload)).load()
    assert not hasattr(dcp_metadata.Metadata, "pwned")
    assert describe(caught.value) == "refused to read it: .metadata sets state on 'Metadata', not on an object"


# checksums --------------------------------------------------------------------------------------------------


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_bit_flipped_weights_are_named_with_the_previous_checkpoint(smoke_run, tmp_path, export, capsys):
    run_dir = copy_run(smoke_run, tmp_path)
    step2, step4 = run_dir / "checkpoints" / "step-2", run_dir / "checkpoints" / "step-4"
    manifest = json.loads((step4 / MANIFEST).read_text())["files"]
    assert sorted(manifest) == [".metadata", "__0_0.distcp"]
    weights = step4 / "__0_0.distcp"
    flip_bit(weights, weights.stat().st_size // 2)
    expected = (
        f"error: {step4}: __0_0.distcp does not match its checksum in {MANIFEST} (corrupted); "
        f"the previous complete checkpoint is {step2}"
    )
    result = export(step4, tmp_path / "export")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"ladder-export: {expected}"]
    assert not (tmp_path / "export" / "model.safetensors").exists()

    result = train(run_dir, "train.max_steps=6")  # resume picks the newest: step-4
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert error_lines(result.stderr) == [expected]

    # so do ladder-eval and the TP loader (ladder-bench, ladder-generate)
    from ladder_train.cli import ladder_eval as eval_main

    capsys.readouterr()
    assert eval_main([str(step4), "--tasks", "arc_easy_local"]) == 1
    assert capsys.readouterr().err == f"ladder-eval: {expected}\n"
    from ladder_train.loading import load_tp_shard

    with pytest.raises(CheckpointError) as err:
        load_tp_shard(step4)
    assert f"error: {err.value}" == expected

    # the previous one is fine
    result = export(step2, tmp_path / "export2")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_truncated_file_without_manifest_gives_one_line(smoke_run, tmp_path, export):
    run_dir = copy_run(smoke_run, tmp_path)
    step2, step4 = run_dir / "checkpoints" / "step-2", run_dir / "checkpoints" / "step-4"
    (step4 / MANIFEST).unlink()  # nothing to verify the truncation against
    weights = step4 / "__0_0.distcp"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    result = export(step4, tmp_path / "export")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    note, error = result.stderr.splitlines()
    assert note.startswith(f"note: {step4} has no {MANIFEST}")
    assert error.startswith(f"ladder-export: error: {step4}: cannot be read (")
    assert error.endswith(f"; the previous complete checkpoint is {step2}")

    # a truncated file that the manifest covers is named before DCP reads anything
    shutil.copy(weights, step2 / "__0_0.distcp")
    result = export(step2, tmp_path / "export2")
    size = (step2 / "__0_0.distcp").stat().st_size
    assert result.stderr.splitlines() == [
        f"ladder-export: error: {step2}: __0_0.distcp has {size} bytes, the manifest says "
        f"{json.loads((step2 / MANIFEST).read_text())['files']['__0_0.distcp']['bytes']}; "
        "the previous complete checkpoint is none"
    ]
