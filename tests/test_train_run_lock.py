"""One trainer per run.dir (ladder_train/train/trainer.py lock_run_dir): a second trainer is refused in one line, on
every rank, a killed one does not block the next, and a link planted as run.lock is refused without touching its
target."""

import contextlib
import os
import signal
import subprocess
import time

import pytest
import torch.distributed as dist
from dist_utils import run_ranks
from test_checkpoint import ENV, PYTHON, SMOKE_EVERY_2, descendants, train

from ladder_train.config import load_config
from ladder_train.errors import InputError

WORKER = "data.num_workers=1"


@pytest.mark.slow
def test_second_trainer_is_refused_and_a_killed_one_does_not_block(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        # a loader worker: forked children must not keep the killed trainer's lock
        [PYTHON, "-m", "ladder_train.train", *SMOKE_EVERY_2, f"run.dir={run_dir}", "train.max_steps=100000", WORKER],
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
        restart = train(run_dir, "train.max_steps=2", "checkpoint.every=0", WORKER)  # resumes the first one's
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
    from ladder_train.train.run_dir import RunDirLocked

    env = init_distributed()
    cfg = load_config(None, [f"run.dir={run_dir}", "model.preset=tiny", "data.seq_len=16", "wandb.mode=disabled"])
    try:
        Trainer(cfg, env, batches=[])
        return None
    except (RunDirLocked, InputError) as err:
        return (str(err), getattr(err, "quiet", False), type(err).__name__)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_of_a_second_trainer_stops_and_only_rank_0_speaks(tmp_path):
    from ladder_train.train.run_dir import lock_run_dir

    holder = lock_run_dir(tmp_path)  # this process plays the first trainer
    try:
        results = run_ranks(construct_trainer, 2, str(tmp_path))
    finally:
        holder.close()
    message = f"run.dir={tmp_path} is in use by another trainer (host {os.uname().nodename}, pid {os.getpid()}, since "
    assert [r[0].startswith(message) for r in results] == [True, True], results
    assert [r[1] for r in results] == [False, True]  # rank 1 raises quietly: one line in all
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "checkpoints").exists()


def planted_link(tmp_path):
    """``ln -s VICTIM RUN/run.lock``: (run folder, victim, the victim's bytes)."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone's file\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.lock").symlink_to(victim)
    return run_dir, victim, victim.read_bytes()


@pytest.mark.slow
def test_a_link_planted_as_run_lock_is_refused_in_one_line_and_its_target_is_untouched(tmp_path):
    run_dir, victim, before = planted_link(tmp_path)
    refused = train(run_dir, "train.max_steps=2")
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"ladder-train: error: {run_dir / 'run.lock'} is a symbolic link; "), line
    assert victim.read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.lock"] and (run_dir / "run.lock").is_symlink()


@pytest.mark.slow
def test_every_rank_stops_on_a_planted_run_lock_link_and_only_rank_0_speaks(tmp_path):
    run_dir, victim, before = planted_link(tmp_path)
    results = run_ranks(construct_trainer, 2, str(run_dir))
    message = f"{run_dir / 'run.lock'} is a symbolic link; "
    assert [r[0].startswith(message) for r in results] == [True, True], results
    assert [r[1:] for r in results] == [(False, "InputError"), (True, "InputError")]  # exit 2, one line in all
    assert victim.read_bytes() == before
