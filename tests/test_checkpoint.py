"""The checkpoint package: exact resume after SIGKILL, resharding 4 -> 2 -> 1 processes, SIGTERM preemption,
torn folders, shape mismatches, checkpoint.keep, reading a checkpoint without running its code, checksums with
one-line errors naming the previous complete checkpoint, one wandb id across a multi-process resume, the run.dir
lock (train/run_lock.py), and the Hugging Face export (ladder-export)."""

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

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from dist_utils import run_ranks

from ladder_train.checkpoint import MANIFEST, Checkpointer, CheckpointError, read_trainer_state
from ladder_train.config import ConfigError, load_config
from ladder_train.errors import EXIT_REQUEUE
from ladder_train.folders import COMPLETE_MARKER

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SMOKE = [
    "--config",
    str(REPO / "recipes" / "smoke.yaml"),
    "train.max_steps=12",
    "train.log_every=1",
    "checkpoint.every=4",
    "data.num_workers=1",
]
# the smoke recipe with a checkpoint every 2 steps (the length is given per test)
SMOKE_EVERY_2 = [
    "--config",
    str(REPO / "recipes" / "smoke.yaml"),
    "train.log_every=1",
    "data.num_workers=1",
    "checkpoint.every=2",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def console(entry: str) -> list[str]:
    """The command line of a console script (``ladder_train.cli.<entry>``) run by this interpreter."""
    return [PYTHON, "-c", f"import sys; from ladder_train.cli import {entry}; sys.exit({entry}())"]


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """The last logged loss of every step (a resumed run logs the replayed steps again)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records}


def torchrun(run_dir: Path, nproc: int, *extra: str) -> subprocess.Popen:
    cmd = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "ladder_train.train",
    ]
    return subprocess.Popen(
        [*cmd, *SMOKE, f"run.dir={run_dir}", *extra],
        env=ENV,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").is_file() and max(losses_by_step(run_dir), default=0) >= step:
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended early:\n{proc.stdout.read()}")
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc)."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                frontier += children
    return found


def train(run_dir: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "ladder_train.train", *SMOKE_EVERY_2, f"run.dir={run_dir}", *extra],
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
    """ladder-export in this process (a new process per call would add ~8 s of imports), under the console
    scripts' error policy."""
    from ladder_train.cli import run_command
    from ladder_train.cli.export import run as export_command

    def run(checkpoint: Path, out: Path) -> Exported:
        capsys.readouterr()
        code = run_command("ladder-export", export_command, [str(checkpoint), str(out)])
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


# save and resume --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_every_loss(tmp_path):
    reference = tmp_path / "reference"
    proc = torchrun(reference, 2)
    assert proc.wait(timeout=300) == 0, proc.stdout.read()

    killed = tmp_path / "killed"
    proc = torchrun(killed, 2)
    wait_for_step(killed, 6, proc)  # past the step-4 checkpoint, before step 8's
    # torchrun starts each rank in a session of its own: kill the agent, the ranks and their data
    # workers at once, as a node failure would
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    saved = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "step-4" in saved and "step-12" not in saved

    proc = torchrun(killed, 2)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert "resuming from" in output
    expected, resumed = losses_by_step(reference), losses_by_step(killed)
    assert sorted(expected) == list(range(1, 13))
    assert resumed == expected  # bit for bit, every step


SEQ, GLOBAL, VOCAB = 16, 8, 256


def step_batches(rank: int, world: int, micro: int, start_step: int):
    """Global batch s is fixed by s alone; each rank takes its rows (the data position is the step)."""
    per_rank = GLOBAL // world
    step = start_step
    while True:
        tokens = torch.randint(0, VOCAB, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(step))
        mine = tokens[rank * per_rank : (rank + 1) * per_rank]
        for start in range(0, per_rank, micro):
            yield mine[start : start + micro, :-1], mine[start : start + micro, 1:]
        step += 1


def train_synthetic(run_dir: str, start_step: int, max_steps: int, extra=()):
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    overrides = [
        f"run.dir={run_dir}",
        f"model.vocab_size={VOCAB}",
        "model.dim=32",
        "model.n_layers=2",
        "model.n_heads=4",
        "model.ffn_dim=64",
        f"model.max_seq_len={SEQ}",
        "model.residual=ladder",
        f"data.seq_len={SEQ}",
        f"train.global_batch_size={GLOBAL}",
        "train.micro_batch_size=2",
        f"train.max_steps={max_steps}",
        "train.log_every=1",
        "train.schedule.warmup_steps=2",
        "train.schedule.total_steps=10",
        "checkpoint.every=3",
        "wandb.mode=disabled",
        *extra,
    ]
    cfg = load_config(None, overrides)
    try:
        trainer = Trainer(cfg, env, batches=step_batches(env.rank, env.world_size, 2, start_step))
        return {r["step"]: r["loss"] for r in trainer.train()}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_hsdp_checkpoint_resumes_on_fewer_processes(tmp_path):
    original = tmp_path / "four"
    reference = run_ranks(train_synthetic, 4, str(original), 0, 6, local_world_size=2)[0]  # HSDP 2 x 2
    assert sorted(reference) == [1, 2, 3, 4, 5, 6]
    for world in (2, 1):
        resumed_dir = tmp_path / f"on{world}"
        shutil.copytree(original, resumed_dir)
        shutil.rmtree(resumed_dir / "checkpoints" / "step-6")  # resume from step 3
        (resumed_dir / "metrics.jsonl").unlink()
        resumed = run_ranks(train_synthetic, world, str(resumed_dir), 3, 6)[0]
        assert sorted(resumed) == [4, 5, 6]
        for step in (4, 5, 6):
            assert resumed[step] == pytest.approx(reference[step], abs=1e-5)


@pytest.mark.slow
def test_other_layout_is_refused_naming_the_mismatch(tmp_path):
    run_ranks(train_synthetic, 1, str(tmp_path), 0, 3)
    with pytest.raises(Exception) as err:
        run_ranks(train_synthetic, 1, str(tmp_path), 3, 6, ["model.residual=parallel"])
    # the child's CheckpointError reaches us through mp.spawn's error text
    assert "residual: checkpoint 'ladder', run 'parallel'" in str(err.value)


@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_exits_for_requeue(tmp_path):
    run_dir = tmp_path / "run"
    proc = torchrun(run_dir, 1, "train.max_steps=200", "checkpoint.every=0")
    wait_for_step(run_dir, 3, proc)
    # torchrun forwards SIGTERM to its worker, which finishes the step and saves
    os.killpg(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    last_step = max(losses_by_step(run_dir))
    assert (run_dir / "checkpoints" / f"step-{last_step}" / COMPLETE_MARKER).is_file(), output
    assert f"exit {EXIT_REQUEUE} to requeue" in output


def test_incomplete_checkpoint_is_skipped_with_a_warning(tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    for step, complete in ((4, True), (8, True), (12, False)):
        (folder / f"step-{step}").mkdir(parents=True)
        if complete:
            (folder / f"step-{step}" / COMPLETE_MARKER).write_text("done")
    (folder / "step-16.partial").mkdir()  # a save that never finished
    cfg = load_config(None, [])
    checkpointer = Checkpointer(cfg.checkpoint, tmp_path, rank=0, world_size=1)
    assert checkpointer.resume_path() == folder / "step-8"
    err = capsys.readouterr().err
    assert "skipping incomplete checkpoint" in err and "step-12" in err and "step-16" not in err
    cfg = load_config(None, [f"checkpoint.load={folder / 'step-12'}"])
    with pytest.raises(CheckpointError, match="step-12: not a complete checkpoint"):
        Checkpointer(cfg.checkpoint, tmp_path, rank=0, world_size=1).resume_path()


@pytest.mark.slow
def test_keep_zero_keeps_every_checkpoint(smoke_run):
    names = sorted(p.name for p in (smoke_run / "checkpoints").iterdir())
    assert names == ["step-2", "step-4"]
    assert all((smoke_run / "checkpoints" / n / COMPLETE_MARKER).is_file() for n in names)


def test_negative_keep_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"key 'checkpoint.keep' must be >= 0 .* got -1"):
        load_config(None, ["checkpoint.keep=-1"])


def test_checkpoint_load_of_a_missing_folder_says_so(tmp_path):
    missing = tmp_path / "runs" / "x" / "checkpoints" / "step-9"
    cfg = load_config(None, [f"checkpoint.load={missing}"])
    with pytest.raises(CheckpointError, match=f"^checkpoint.load={missing}: no such folder$"):
        Checkpointer(cfg.checkpoint, tmp_path, rank=0, world_size=1).resume_path()


def torchrun_two_processes(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ladder_train.train"]
        + [*SMOKE_EVERY_2, f"run.dir={run_dir}", "data.num_workers=0", *extra],
        env={**ENV, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.slow
def test_two_process_resume_keeps_the_wandb_id(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    first = torchrun_two_processes(run_dir, "train.max_steps=2")
    assert first.returncode == 0, first.stderr
    saved = read_trainer_state(run_dir / "checkpoints" / "step-2")["wandb_id"]
    assert isinstance(saved, str) and saved
    second = torchrun_two_processes(run_dir, "train.max_steps=4")
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stdout
    assert read_trainer_state(run_dir / "checkpoints" / "step-4")["wandb_id"] == saved
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{saved}") for name in runs), runs


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
    from ladder_train.checkpoint.files import write_manifest

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

    # resume: the rank entry (read last, after the weights) is refused too
    shutil.copytree(tmp_path / "rank_bytes" / "checkpoints" / "step-4", run_dir / "checkpoints" / "step-6")
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


# one trainer per run.dir ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_second_trainer_is_refused_and_a_killed_one_does_not_block(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [PYTHON, "-m", "ladder_train.train", *SMOKE_EVERY_2, f"run.dir={run_dir}", "train.max_steps=100000"],
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
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer
    from ladder_train.train.run_lock import RunDirLocked

    env = init_distributed()
    cfg = load_config(None, [f"run.dir={run_dir}", "model.preset=tiny", "data.seq_len=16", "wandb.mode=disabled"])
    try:
        Trainer(cfg, env, batches=[])
        return None
    except RunDirLocked as err:
        return (str(err), err.quiet)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_of_a_second_trainer_stops_and_only_rank_0_speaks(tmp_path):
    from ladder_train.train.run_lock import lock_run_dir

    holder = lock_run_dir(tmp_path)  # this process plays the first trainer
    try:
        results = run_ranks(construct_trainer, 2, str(tmp_path))
    finally:
        holder.close()
    message = f"run.dir={tmp_path} is in use by another trainer (host {os.uname().nodename}, pid {os.getpid()}, since "
    assert [r[0].startswith(message) for r in results] == [True, True], results
    assert [r[1] for r in results] == [False, True]  # rank 1 raises quietly: one line in all
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "checkpoints").exists()


# the Hugging Face export ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_standard_export_matches_llama_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    run_ranks(train_synthetic, 1, str(tmp_path / "run"), 0, 3, ["model.residual=standard", "model.n_kv_heads=2"])
    out = tmp_path / "export"
    result = subprocess.run(
        [*console("ladder_export"), str(tmp_path / "run" / "checkpoints" / "step-3"), str(out)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["residual"] == "standard" and config["num_key_value_heads"] == 2

    from ladder_train import load_model

    ours = load_model(out).eval()
    llama = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(llama(ids).logits, ours(ids), atol=1e-5, rtol=1e-5)
    # and the checkpoint itself loads to the same model
    from_checkpoint = load_model(tmp_path / "run" / "checkpoints" / "step-3")
    with torch.no_grad():
        torch.testing.assert_close(from_checkpoint(ids), ours(ids), atol=0, rtol=0)


def test_export_of_a_missing_folder_says_so(tmp_path, export):
    result = export(tmp_path / "runs" / "x" / "checkpoints" / "step-9", tmp_path / "out")
    assert result.returncode == 2  # a path the user typed: bad input
    assert result.stderr.splitlines() == [
        f"ladder-export: error: {tmp_path / 'runs' / 'x' / 'checkpoints' / 'step-9'}: no such folder"
    ]


# the checkpoint stall benchmark -----------------------------------------------------------------------------


def test_checkpoint_bench_stall_is_the_extra_time_of_intervals_holding_a_save():
    from benchmarks.checkpoint_stall import stall_per_save

    # every 3 steps a save adds 0.5 s to the next interval (indices 3 and 6); index 0 is the warm-up step
    walls = [2.0, 1.0, 1.1, 1.5, 0.9, 1.0, 1.6, 1.0]
    assert stall_per_save(walls, 3) == pytest.approx(1.55 - 1.0)


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
