"""Issue 17 hardening: config refusals, the trainer benchmark's honesty, the Slurm scripts, once-per-job data
notes, orphan-free loader workers, one-line data errors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ladder_train.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}


# -- 9a: log_every=0 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value", [("train.log_every", 0), ("data.shuffle_buffer", -1), ("parallel.timeout_s", 0)])
def test_non_positive_intervals_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "recipes/smoke.yaml", [f"{key}={value}"])
    message = str(err.value)
    assert f"key '{key}'" in message and f"got {value}" in message and "\n" not in message


# -- 10: the trainer benchmark times real steps ----------------------------------------------------------

BENCH_TINY = ["model.vocab_size=64", "model.dim=32", "model.n_layers=1", "model.n_heads=2", "model.ffn_dim=64",
              "model.max_seq_len=16", "data.seq_len=16", "train.global_batch_size=2", "train.micro_batch_size=2"]  # fmt: skip


def run_bench(tmp_path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **OFFLINE}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_trainer_benchmark_rounds_each_train_the_asked_steps(tmp_path):
    # a second round in a reused run folder resumed at max_steps and "trained" nothing at 100x the speed
    code = f"from ladder_train.train.bench import main; main(['--steps', '3', '--rounds', '2', *{BENCH_TINY!r}])"
    done = run_bench(tmp_path, code)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("trainer"))
    assert line.endswith("; each ran 3 steps in a fresh run folder)"), line
    rounds = [float(x.replace(",", "")) for x in line.split("rounds: ")[1].split(";")[0].split(", ")]
    assert len(rounds) == 2 and max(rounds) / min(rounds) < 5, line
    assert not (tmp_path / "runs").exists()  # nothing left behind for a later run to resume from


def test_trainer_benchmark_fails_loudly_when_a_round_runs_fewer_steps(tmp_path):
    code = f"""
from ladder_train.train import bench, trainer
real_train = trainer.Trainer.train
def short_train(self):  # a trainer that stops early, as a resumed run does
    self.max_steps = 1
    return real_train(self)
trainer.Trainer.train = short_train
bench.main(['--steps', '3', '--rounds', '1', *{BENCH_TINY!r}])
"""
    done = run_bench(tmp_path, code)
    assert done.returncode != 0
    assert "BenchmarkError: trainer round ran 1 steps (from step 0, 1 logged) instead of 3" in done.stderr


# -- 12: the paper recipe reads enough data, shuffled ----------------------------------------------------


@pytest.mark.parametrize("recipe", ["paper.yaml", "ladder_3b.yaml", "standard_1b.yaml"])
def test_paper_recipes_stream_sample_100bt_shuffled(recipe):
    cfg = load_config(REPO / "recipes" / recipe)
    assert (cfg.data.source, cfg.data.hub_config) == ("HuggingFaceFW/fineweb-edu", "sample-100BT")
    tokens = cfg.train.schedule.total_steps * cfg.train.global_batch_size * cfg.data.seq_len
    assert 100e9 <= tokens <= 110e9  # about one pass over the 100B-token sample, not ten over sample-10BT
    assert cfg.data.shuffle_buffer >= 1000


# -- 8: kill -9 of the trainer takes its loader workers with it ------------------------------------------


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead orphan may wait for a reaper that never comes in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_loader_workers_die_with_a_killed_trainer(tmp_path):
    import signal
    import time

    # batches of 8 x 2048 tokens (~260 kB) fill the worker -> trainer pipe, where an orphaned worker used to
    # block forever (the trainer is slow to take them: each step trains on one)
    cmd = [sys.executable, "-u", "-m", "ladder_train.train", "--config", str(REPO / "recipes/smoke.yaml"),
           f"run.dir={tmp_path / 'run'}", "model.max_seq_len=2048", "data.seq_len=2048", "data.num_workers=2",
           "train.micro_batch_size=8", "train.max_steps=1000", "train.log_every=1"]  # fmt: skip
    trainer = subprocess.Popen(cmd, env={**os.environ, **OFFLINE}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)  # fmt: skip
    workers: set[int] = set()
    try:
        for line in trainer.stdout:  # the first step is logged once the workers are delivering batches
            if line.startswith("step"):
                break
        workers = _children(trainer.pid)
        assert len(workers) >= 2, workers
        time.sleep(2)  # let the workers fill the pipe
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and any(_running(p) for p in workers):
            time.sleep(0.1)
        assert not [p for p in workers if _running(p)], "loader workers outlived the killed trainer"
    finally:
        trainer.kill()
        for pid in workers:  # orphans of a failed run: ours to end
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


# -- 9b: a malformed line deep in a jsonl file -----------------------------------------------------------


def test_malformed_jsonl_line_after_the_first_is_one_line_naming_file_and_line(tmp_path):
    source = tmp_path / "docs.jsonl"
    good = [f'{{"text": "document {i} ' + "abc " * 50 + '"}' for i in range(40)]
    source.write_text("\n".join(good[:30] + ['{"text": "cut off', *good[30:]]) + "\n")
    cmd = [sys.executable, "-m", "ladder_train.train", "--config", str(REPO / "recipes/smoke.yaml"),
           f"run.dir={tmp_path / 'run'}", f"data.source={source}", "data.num_workers=2", "train.max_steps=50"]  # fmt: skip
    done = subprocess.run(cmd, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {source}: line 31 is not JSON (Invalid control character at column 18); "
        "expected one JSON object per line"
    )
