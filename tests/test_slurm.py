"""The Slurm scripts (slurm/): where their logs go, what the launcher sets and forwards, the dry-run plan of the
pretraining and study scripts, and the README's torchrun lines that match them."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_sbatch_output_goes_to_a_folder_a_fresh_clone_has():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    folders = {str(Path(p).parent) for p in tracked.splitlines()}
    scripts = sorted((REPO / "slurm").glob("*.sh"))
    outputs = [
        (s.name, line.split("=", 1)[1].strip())
        for s in scripts
        for line in s.read_text().splitlines()
        if line.startswith("#SBATCH --output=")
    ]
    assert {name for name, _ in outputs} >= {"pretrain_1b.sh", "pretrain_3b.sh", "eval.sh", "bench_tp.sh"}
    for name, path in outputs:  # Slurm opens this file before the script runs: its folder must exist already
        assert str(Path(path).parent) in folders, f"{name}: --output={path}"


@pytest.mark.slow
def test_launcher_sets_diagnostics_and_forwards_sigusr1(tmp_path):
    (tmp_path / "bin").mkdir()
    shutil.copytree(REPO / "slurm", tmp_path / "slurm")
    fake_srun = f'#!/bin/bash\nenv > {tmp_path}/srun.env\necho "$@" > {tmp_path}/srun.args\n'
    for name, body in (("srun", fake_srun), ("scontrol", "#!/bin/bash\necho node001\n")):
        (tmp_path / "bin" / name).write_text(body)
        (tmp_path / "bin" / name).chmod(0o755)
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node[001-002]",
        "SLURM_JOB_NAME": "ladder-3b",
        "SLURM_CPUS_PER_TASK": "64",
    }
    done = subprocess.run(["bash", str(tmp_path / "slurm/pretrain_3b.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in (tmp_path / "srun.env").read_text().splitlines() if "=" in line)
    assert seen["NCCL_DEBUG"] == "WARN" and seen["PYTHONFAULTHANDLER"] == "1"
    assert seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(seen["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert seen["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path}/nccl-trace-4242/rank_"
    assert (tmp_path / "nccl-trace-4242").is_dir()
    args = (tmp_path / "srun.args").read_text()
    assert "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in args and "--nnodes 2" in args
    assert "--cpus-per-task 64" in args and seen["SRUN_CPUS_PER_TASK"] == "64"  # srun does not inherit sbatch's
    # torchrun waits this long for the preempted ranks' save, inside the sbatch script's signal lead time
    lead = int(re.search(r"#SBATCH --signal=B:USR1@(\d+)", (REPO / "slurm/pretrain_3b.sh").read_text()).group(1))
    assert int(seen["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == 100 < lead
    env["SHUTDOWN_TIMEOUT_S"] = "280"
    subprocess.run(["bash", str(tmp_path / "slurm/pretrain_3b.sh")], env=env, check=True, capture_output=True)
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=280" in (tmp_path / "srun.env").read_text().splitlines()


def test_torchrun_reads_the_shutdown_timeout_the_launcher_sets(monkeypatch):
    from torch.distributed.launcher.api import LaunchConfig

    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "100")
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout == 100


def test_readme_torchrun_commands_forward_sigusr1():
    training = (REPO / "README.md").read_text().split("## Training", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in training.splitlines() if line.startswith("torchrun ")]
    assert commands and all("--signals-to-handle" in c and "SIGUSR1" in c for c in commands), commands
    assert "exit 1" in training.replace("exits 1", "exit 1") and "75" in training


@pytest.mark.slow
def test_dry_run_via_slurm_script():
    out = subprocess.run(
        ["bash", str(REPO / "slurm" / "pretrain_3b.sh")],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LADDER_DRY_RUN": "1", "SLURM_NNODES": "16"},
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "mesh (16, 8)" in out.stdout and "standard_3b" in out.stdout


@pytest.mark.slow
def test_the_array_script_runs_its_tasks_point(tmp_path):
    env = {
        **os.environ,
        "LADDER_DRY_RUN": "1",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_NNODES": "1",
        "GPUS_PER_NODE": "2",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }
    cmd = ["bash", str(REPO / "slurm" / "study.sh"), SMOKE, "model.residual=standard,ladder", f"run.dir={tmp_path}/s"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "dry run: s/model.residual=ladder | 1 nodes x 2 GPUs = 2 processes" in done.stdout
    script = (REPO / "slurm" / "study.sh").read_text()
    for line in ("#SBATCH --requeue", "#SBATCH --signal=B:USR1@120", "#SBATCH --output=slurm-%x-%A_%a.out"):
        assert line in script.splitlines()


@pytest.mark.slow
def test_the_array_script_refuses_to_run_outside_an_array(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_ARRAY_TASK_ID"}
    done = subprocess.run(
        ["bash", str(REPO / "slurm" / "study.sh"), SMOKE], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "sbatch --array" in done.stderr
