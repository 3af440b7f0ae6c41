"""The checkpoint package: exact resume after torchrun is SIGKILLed (its ranks ending with it), resharding
4 -> 2 -> 1 processes, SIGTERM preemption, torn folders, shape mismatches, checkpoint.keep and checkpoint.load, one
wandb id across a multi-process resume, the checkpoint stall benchmark. Damaged and crafted checkpoints:
tests/test_checkpoint_integrity.py."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from launch import descendants, run, survivors, wait_until

from ladder_train.checkpoint import Checkpointer, CheckpointError, read_trainer_state
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
# the smoke recipe (no loader worker) with a checkpoint every 2 steps (the length is given per test)
SMOKE_EVERY_2 = [
    "--config",
    str(REPO / "recipes" / "smoke.yaml"),
    "train.log_every=1",
    "checkpoint.every=2",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """The last logged loss of every step (a resumed run logs the replayed steps again)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records}


def torchrun(launch, run_dir: Path, nproc: int, *extra: str, env=None) -> subprocess.Popen:
    """The smoke run on ``nproc`` ranks under torchrun, started by ``launch`` (the fixture), its output in stdout."""
    cmd = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "ladder_train.train"]
    return launch(*cmd, *SMOKE, f"run.dir={run_dir}", *extra, env=env or ENV, stderr=subprocess.STDOUT)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    def reached() -> bool:
        return (run_dir / "metrics.jsonl").is_file() and max(losses_by_step(run_dir), default=0) >= step

    wait_until(proc, reached, f"training did not reach step {step}", timeout)


def train(run_dir: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    """The smoke run with a checkpoint every 2 steps, run to its end in a process of its own."""
    return run("-m", "ladder_train.train", *SMOKE_EVERY_2, f"run.dir={run_dir}", *extra, env=env or ENV)


# save and resume --------------------------------------------------------------------------------------------


WANDB_OFFLINE = {**ENV, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_kill_9_of_torchrun_ends_every_rank_and_the_resume_repeats_every_loss_and_the_wandb_id(tmp_path, launch):
    """One killed two-rank run checks four things: a SIGKILLed torchrun's ranks save on their way out (their
    parent-death signal is SIGTERM) and end, with their loader workers; a torn last save is skipped; the run resumed
    from the periodic checkpoint before it replays every loss bit for bit; and it logs to the same wandb run."""
    pytest.importorskip("wandb")
    reference = tmp_path / "reference"
    proc = torchrun(launch, reference, 2)
    assert proc.wait(timeout=300) == 0, proc.stdout.read()

    killed = tmp_path / "killed"
    proc = torchrun(launch, killed, 2, env=WANDB_OFFLINE)
    wait_for_step(killed, 6, proc)  # past the step-4 checkpoint
    run = descendants(proc.pid)  # two ranks and their loader workers
    assert len(run) >= 4, run
    proc.send_signal(signal.SIGKILL)  # kill -9 of torchrun alone: what it started must end with it
    proc.wait(timeout=10)
    assert not survivors(run, seconds=20), "processes of the run outlived torchrun"
    folder = killed / "checkpoints"
    complete = sorted(int(p.parent.name.split("-")[1]) for p in folder.glob(f"step-*/{COMPLETE_MARKER}"))
    assert 6 <= complete[-1] < 12 and 4 in complete, complete  # the ranks' save on their way out
    # as a node failure would leave it: the last save torn, so the resume replays from the periodic one before it
    (folder / f"step-{complete[-1]}" / COMPLETE_MARKER).unlink()
    periodic = folder / f"step-{complete[-2]}"
    wandb_id = read_trainer_state(periodic)["wandb_id"]
    assert isinstance(wandb_id, str) and wandb_id

    proc = torchrun(launch, killed, 2, env=WANDB_OFFLINE)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert f"resuming from {periodic} at step {complete[-2]}" in output
    expected, resumed = losses_by_step(reference), losses_by_step(killed)
    assert sorted(expected) == list(range(1, 13))
    assert resumed == expected  # bit for bit, every step
    assert read_trainer_state(killed / "checkpoints" / "step-12")["wandb_id"] == wandb_id
    runs = sorted(p.name for p in (killed / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{wandb_id}") for name in runs), runs


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
def test_hsdp_checkpoint_resumes_on_fewer_processes_and_in_other_fsdp_units(tmp_path):
    original = tmp_path / "four"
    reference = run_ranks(train_synthetic, 4, str(original), 0, 6, local_world_size=2)[0]  # HSDP 2 x 2
    assert sorted(reference) == [1, 2, 3, 4, 5, 6]
    # each parameter is sharded on its own whatever the unit, so both blocks in one FSDP unit read the same state
    for world, extra in ((2, []), (1, []), (2, ["parallel.blocks_per_fsdp_unit=2"])):
        resumed_dir = tmp_path / f"on{world}{'-paired' if extra else ''}"
        shutil.copytree(original, resumed_dir)
        shutil.rmtree(resumed_dir / "checkpoints" / "step-6")  # resume from step 3
        (resumed_dir / "metrics.jsonl").unlink()
        resumed = run_ranks(train_synthetic, world, str(resumed_dir), 3, 6, extra)[0]
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
def test_sigterm_saves_the_current_step_and_exits_for_requeue(tmp_path, launch):
    run_dir = tmp_path / "run"
    proc = torchrun(launch, run_dir, 1, "train.max_steps=200", "checkpoint.every=0")
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


def test_negative_keep_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"key 'checkpoint.keep' must be >= 0 .* got -1"):
        load_config(None, ["checkpoint.keep=-1"])


def test_checkpoint_load_of_a_missing_folder_says_so(tmp_path):
    missing = tmp_path / "runs" / "x" / "checkpoints" / "step-9"
    cfg = load_config(None, [f"checkpoint.load={missing}"])
    with pytest.raises(CheckpointError, match=f"^checkpoint.load={missing}: no such folder$"):
        Checkpointer(cfg.checkpoint, tmp_path, rank=0, world_size=1).resume_path()


# the checkpoint stall benchmark -----------------------------------------------------------------------------


def test_checkpoint_bench_stall_is_the_extra_time_of_intervals_holding_a_save():
    from benchmarks.checkpoint_stall import stall_per_save

    # every 3 steps a save adds 0.5 s to the next interval (indices 3 and 6); index 0 is the warm-up step
    walls = [2.0, 1.0, 1.1, 1.5, 0.9, 1.0, 1.6, 1.0]
    assert stall_per_save(walls, 3) == pytest.approx(1.55 - 1.0)
