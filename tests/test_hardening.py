"""Issue 17 hardening: config refusals, the trainer benchmark's honesty, the Slurm scripts, once-per-job data
notes, orphan-free loader workers, one-line data errors."""

import os
import shutil
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
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(REPO)}  # benchmarks/ is not installed: run from the repo
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_trainer_benchmark_rounds_each_train_the_asked_steps(tmp_path):
    # a second round in a reused run folder resumed at max_steps and "trained" nothing at 100x the speed
    code = f"from benchmarks.train_step import main; main(['--steps', '3', '--rounds', '2', *{BENCH_TINY!r}])"
    done = run_bench(tmp_path, code)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("trainer"))
    assert line.endswith("; each ran 3 steps in a fresh run folder)"), line
    rounds = [float(x.replace(",", "")) for x in line.split("rounds: ")[1].split(";")[0].split(", ")]
    assert len(rounds) == 2 and max(rounds) / min(rounds) < 5, line
    assert not (tmp_path / "runs").exists()  # nothing left behind for a later run to resume from


def test_trainer_benchmark_fails_loudly_when_a_round_runs_fewer_steps(tmp_path):
    code = f"""
from benchmarks import train_step as bench
from ladder_train.train import trainer
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
        f"ladder-train: error: {source}: line 31 is not JSON (Invalid control character at column 18); "
        "expected one JSON object per line"
    )


# -- 7: Slurm scripts, once-per-job data notes, torchrun and SIGUSR1 --------------------------------------


def test_sbatch_output_goes_to_a_folder_a_fresh_clone_has():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    folders = {str(Path(p).parent) for p in tracked.splitlines()}
    scripts = sorted((REPO / "slurm").glob("*.sh"))
    outputs = [(s.name, line.split("=", 1)[1].strip()) for s in scripts for line in s.read_text().splitlines()
               if line.startswith("#SBATCH --output=")]  # fmt: skip
    assert {name for name, _ in outputs} >= {"pretrain_1b.sh", "pretrain_3b.sh", "eval.sh", "bench_tp.sh"}
    for name, path in outputs:  # Slurm opens this file before the script runs: its folder must exist already
        assert str(Path(path).parent) in folders, f"{name}: --output={path}"


def test_launcher_sets_diagnostics_and_forwards_sigusr1(tmp_path):
    (tmp_path / "bin").mkdir()
    shutil.copytree(REPO / "slurm", tmp_path / "slurm")
    fake_srun = f'#!/bin/bash\nenv > {tmp_path}/srun.env\necho "$@" > {tmp_path}/srun.args\n'
    for name, body in (("srun", fake_srun), ("scontrol", "#!/bin/bash\necho node001\n")):
        (tmp_path / "bin" / name).write_text(body)
        (tmp_path / "bin" / name).chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "4242",
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[001-002]", "SLURM_JOB_NAME": "ladder-3b"}  # fmt: skip
    done = subprocess.run(["bash", str(tmp_path / "slurm/pretrain_3b.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in (tmp_path / "srun.env").read_text().splitlines() if "=" in line)
    assert seen["NCCL_DEBUG"] == "WARN" and seen["PYTHONFAULTHANDLER"] == "1"
    assert seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(seen["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert seen["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path}/nccl-trace-4242/rank_"
    assert (tmp_path / "nccl-trace-4242").is_dir()
    args = (tmp_path / "srun.args").read_text()
    assert "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in args and "--nnodes 2" in args


def test_data_notes_come_from_rank_zero_once(tmp_path, monkeypatch, caplog):
    from ladder_train.config import DataConfig
    from ladder_train.data import build_dataloader, byte_tokenizer, load_tokenizer

    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "hello"}\n')
    cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=4)
    for rank, expected in (("3", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        caplog.clear()
        for _ in range(2):  # the validation loader opens the source again at every validation
            build_dataloader(cfg, byte_tokenizer(), 1, num_workers=0)
            load_tokenizer(cfg.tokenizer)
        corpus = [r for r in caplog.records if r.getMessage().startswith(f"data: corpus = local {source}")]
        assert len(corpus) == expected, (rank, [r.getMessage() for r in caplog.records])


def test_readme_torchrun_commands_forward_sigusr1():
    training = (REPO / "README.md").read_text().split("## Training", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in training.splitlines() if line.startswith("torchrun ")]
    assert commands and all("--signals-to-handle" in c and "SIGUSR1" in c for c in commands), commands
    assert "exit 1" in training.replace("exits 1", "exit 1") and "75" in training


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_torchrun_with_sigusr1_forwarding_saves_and_ends_its_ranks(tmp_path):
    """What the README says to expect: the rank saves and exits 75, torchrun itself exits 1."""
    import signal
    import time

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "-m", "ladder_train.train",
           "--config", str(REPO / "recipes/smoke.yaml"), f"run.dir={run_dir}", "train.max_steps=2000",
           "train.log_every=1", "data.num_workers=0"]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, **OFFLINE}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        ranks = _children(proc.pid)
        proc.send_signal(signal.SIGUSR1)  # to torchrun only, as srun delivers it
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, output[-2000:]
        assert "preempted: stopped by a signal after step" in output and "exit 75 to requeue" in output
        assert output.strip().splitlines()[-1].endswith(f"SignalException: Process {proc.pid} got signal: 10")
        assert not [p for p in ranks if _running(p)]
        assert any((run_dir / "checkpoints").glob("step-*/COMPLETE"))
    finally:
        proc.kill()


# -- 11: dependencies declare what the code imports, at versions that have the APIs used -----------------


def test_every_third_party_import_is_declared_with_a_sufficient_floor():
    import ast
    import importlib.metadata as md
    import re
    import tomllib

    declared = {}
    for spec in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec).groups()
        declared[re.sub(r"[-_.]+", "-", name).lower()] = tuple(int(x) for x in floor.split("."))
    modules = set()
    for path in (REPO / "ladder_train").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    owners = md.packages_distributions()
    optional = {"transformers", "wandb"}  # dev extra / imported lazily with a fallback
    missing = []
    for module in sorted(modules - set(sys.stdlib_module_names) - {"ladder_train"}):
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(module, [module])}
        if not dists & (set(declared) | optional):
            missing.append(f"{module} ({', '.join(sorted(dists))})")
    assert not missing, f"imported but not in pyproject dependencies: {missing}"
    assert declared["torch"] >= (2, 9)  # torchrun --signals-to-handle, used by slurm/launch.sh
    assert declared["lm-eval"] >= (0, 4, 12)  # TaskManager.task_index entries with .cfg
