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
