"""Checkpoint hardening (issue 17, items 1-5 and 9c): keep=0 keeps everything, opening a checkpoint never
runs code, one trainer per run.dir, checksums with one-line errors naming the previous good checkpoint,
one wandb id across a multi-process resume, and ladder-export on a missing folder."""

import contextlib
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ladder_train.checkpoint import COMPLETE_MARKER, MANIFEST, CheckpointError, read_trainer_state
from ladder_train.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SMOKE = [
    "--config",
    str(REPO / "recipes" / "smoke.yaml"),
    "train.log_every=1",
    "data.num_workers=1",
    "checkpoint.every=2",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def train(run_dir: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "ladder_train.train", *SMOKE, f"run.dir={run_dir}", *extra],
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


class Exported:
    def __init__(self, returncode: int, stderr: str):
        self.returncode, self.stderr = returncode, stderr


@pytest.fixture
def export(capsys):
    """ladder-export's main in this process (a subprocess would add ~8 s of imports per call)."""
    from ladder_train.cli import export as main

    def run(checkpoint: Path, out: Path) -> Exported:
        capsys.readouterr()
        code = main([str(checkpoint), str(out)])
        return Exported(code, capsys.readouterr().err)

    return run


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


# 1. checkpoint.keep ------------------------------------------------------------------------------------------


def test_keep_zero_keeps_every_checkpoint(smoke_run):
    names = sorted(p.name for p in (smoke_run / "checkpoints").iterdir())
    assert names == ["step-2", "step-4"]
    assert all((smoke_run / "checkpoints" / n / COMPLETE_MARKER).is_file() for n in names)


def test_negative_keep_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"key 'checkpoint.keep' must be >= 0 .* got -1"):
        load_config(None, ["checkpoint.keep=-1"])


# 2. opening a checkpoint never runs code ---------------------------------------------------------------------


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
    from ladder_train.checkpoint_files import write_manifest

    write_manifest(folder)  # the attacker can write matching checksums too


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
        "trainer_object": "the trainer entry holds more than plain data and tensors (UnpicklingError: ",
        "trainer_bytes": "the trainer entry holds more than plain data and tensors (UnpicklingError: ",
        "metadata": ".metadata names io.open, which a checkpoint's metadata never holds",
    }
    for name, why in refusals.items():
        folder = tmp_path / name / "checkpoints" / "step-4"
        result = export(folder, tmp_path / f"export_{name}")
        assert not marker.exists(), f"{name}: the payload ran"
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"ladder-export: error: {folder}: refused to read it: {why}"), line
        assert line.endswith("; the previous complete checkpoint is none")

    # resume: the rank entry (read last, after the weights) is refused too
    shutil.copytree(tmp_path / "rank_bytes" / "checkpoints" / "step-4", run_dir / "checkpoints" / "step-6")
    result = train(run_dir, "train.max_steps=8")
    assert not marker.exists()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = error_lines(result.stderr)
    assert "step-6: refused to read it: the rank0 entry holds more than plain data" in line
    assert line.endswith(f"the previous complete checkpoint is {run_dir / 'checkpoints' / 'step-4'}")


def test_checkpoint_in_the_old_format_still_loads(smoke_run, tmp_path):
    """Before this change the trainer entry was a torch.save pickle and there was no manifest."""
    from ladder_train.checkpoint_data import pack

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
    assert f"note: {step4} has no {MANIFEST} (written before checksums): loading it unverified" in result.stderr
    assert "resuming from" in result.stdout and "at step 4" in result.stdout


# 3. one trainer per run.dir ----------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                frontier += children
    return found


def test_second_trainer_is_refused_and_a_killed_one_does_not_block(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [PYTHON, "-m", "ladder_train.train", *SMOKE, f"run.dir={run_dir}", "train.max_steps=100000"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    workers: list[int] = []
    try:
        deadline = time.time() + 120
        while not (run_dir / "metrics.jsonl").is_file():
            assert first.poll() is None and time.time() < deadline, first.stdout.read()
            time.sleep(0.1)
        config_before = (run_dir / "config.yaml").read_bytes()

        second = train(run_dir, "train.max_steps=2", "model.n_layers=1")
        assert second.returncode == 1
        (line,) = second.stderr.splitlines()
        holder = f"host {os.uname().nodename}, pid {first.pid}, since "
        assert line.startswith(f"ladder-train: error: run.dir={run_dir} is in use by another trainer ({holder}"), line
        assert line.endswith("); wait for it to end or pick another run.dir")
        assert (run_dir / "config.yaml").read_bytes() == config_before  # untouched
        assert first.poll() is None  # the first one trains on

        # kill -9 the trainer alone: its data-loader workers live on for a moment but hold no lock
        workers = descendants(first.pid)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        restart = train(run_dir, "train.max_steps=2", "checkpoint.every=0")
        assert restart.returncode == 0, restart.stderr
        assert "in use by another trainer" not in restart.stderr
    finally:
        for pid in [first.pid, *workers]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.wait()


def construct_trainer(run_dir: str):
    """Build a Trainer on ``run_dir`` in each rank; returns what stopped it."""
    import torch.distributed as dist

    from ladder_train.checkpoint import RunDirLocked
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    cfg = load_config(None, [f"run.dir={run_dir}", "model.preset=tiny", "data.seq_len=16", "wandb.mode=disabled"])
    try:
        Trainer(cfg, env, batches=[])
        return None
    except RunDirLocked as err:
        return (str(err), err.quiet)
    finally:
        dist.destroy_process_group()


def test_every_rank_of_a_second_trainer_stops_and_only_rank_0_speaks(tmp_path):
    from dist_utils import run_ranks

    from ladder_train.checkpoint import lock_run_dir

    holder = lock_run_dir(tmp_path)  # this process plays the first trainer
    try:
        results = run_ranks(construct_trainer, 2, str(tmp_path))
    finally:
        holder.close()
    message = f"run.dir={tmp_path} is in use by another trainer (host {os.uname().nodename}, pid {os.getpid()}, since "
    assert [r[0].startswith(message) for r in results] == [True, True], results
    assert [r[1] for r in results] == [False, True]  # rank 1 raises quietly: one line in all
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "checkpoints").exists()


# 4. checksums --------------------------------------------------------------------------------------------


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


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
    from ladder_train.cli import evaluate as eval_main

    capsys.readouterr()
    assert eval_main([str(step4), "--tasks", "arc_easy_local"]) == 1
    assert capsys.readouterr().err == f"ladder-eval: {expected}\n"
    from ladder_train.loading import load_tp_model

    with pytest.raises(CheckpointError) as err:
        load_tp_model(step4)
    assert f"error: {err.value}" == expected

    # the previous one is fine
    result = export(step2, tmp_path / "export2")
    assert result.returncode == 0, result.stderr


def test_truncated_file_without_manifest_gives_one_line(smoke_run, tmp_path, export):
    run_dir = copy_run(smoke_run, tmp_path)
    step2, step4 = run_dir / "checkpoints" / "step-2", run_dir / "checkpoints" / "step-4"
    (step4 / MANIFEST).unlink()  # as a checkpoint from before checksums
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


# 5. one wandb id across a multi-process resume -----------------------------------------------------------------


def torchrun(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ladder_train.train"]
        + [*SMOKE, f"run.dir={run_dir}", "data.num_workers=0", *extra],
        env={**ENV, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_two_process_resume_keeps_the_wandb_id(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    first = torchrun(run_dir, "train.max_steps=2")
    assert first.returncode == 0, first.stderr
    saved = read_trainer_state(run_dir / "checkpoints" / "step-2")["wandb_id"]
    assert isinstance(saved, str) and saved
    second = torchrun(run_dir, "train.max_steps=4")
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stdout
    assert read_trainer_state(run_dir / "checkpoints" / "step-4")["wandb_id"] == saved
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{saved}") for name in runs), runs


# 9c. ladder-export on a missing folder -------------------------------------------------------------------------


def test_export_of_a_missing_folder_says_so(tmp_path, export):
    result = export(tmp_path / "runs" / "x" / "checkpoints" / "step-9", tmp_path / "out")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"ladder-export: error: {tmp_path / 'runs' / 'x' / 'checkpoints' / 'step-9'}: no such folder"
    ]


def test_checkpoint_load_of_a_missing_folder_says_so(tmp_path):
    from ladder_train.checkpoint import Checkpointer

    missing = tmp_path / "runs" / "x" / "checkpoints" / "step-9"
    cfg = load_config(None, [f"checkpoint.load={missing}"])
    with pytest.raises(CheckpointError, match=f"^checkpoint.load={missing}: no such folder$"):
        Checkpointer(cfg.checkpoint, tmp_path, rank=0, world_size=1).resume_path()
