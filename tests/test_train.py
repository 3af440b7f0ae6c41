"""The training loop under FSDP2/HSDP on gloo: sharding, accumulation and the schedule change nothing
but speed; the smoke recipe learns; the dry-run plan of the 3.5B recipe; non-finite losses, wandb's fallback,
signals and loader workers; the evaluator at the end of a run."""

import json
import math
import os
import subprocess
import sys
from datetime import UTC
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from tiny import tiny_run_config

from ladder_train.config import load_config
from ladder_train.train.dry_run import dry_run
from ladder_train.train.optim import lr_factor, resolve_schedule_steps

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
SEQ, GLOBAL, VOCAB, STEPS = 16, 8, 256, 5


def tiny_config(residual: str, micro: int, tmp: str, **extra):
    return tiny_run_config(
        tmp,
        VOCAB,
        SEQ,
        residual,
        **{
            "train.global_batch_size": GLOBAL,
            "train.micro_batch_size": micro,
            "train.max_steps": STEPS,
            "train.optimizer.lr": 3e-3,
            "train.schedule.warmup_steps": 2,
            "train.schedule.total_steps": 10,
            **extra,
        },
    )


def global_batches(rank: int, world: int, micro: int):
    """This rank's micro-batches of the same fixed global batches, whatever the world size."""
    per_rank = GLOBAL // world
    step = 0
    while True:
        tokens = torch.randint(0, VOCAB, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(step))
        mine = tokens[rank * per_rank : (rank + 1) * per_rank]
        for start in range(0, per_rank, micro):
            chunk = mine[start : start + micro]
            yield chunk[:, :-1], chunk[:, 1:]
        step += 1


def train_losses(layouts, micro, tmp, replicate=-1, shard=-1):
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    losses = {}
    try:
        for residual in layouts:
            cfg = tiny_config(
                residual, micro, f"{tmp}/{residual}", **{"parallel.dp_replicate": replicate, "parallel.dp_shard": shard}
            )
            trainer = Trainer(cfg, env, batches=global_batches(env.rank, env.world_size, micro))
            losses[residual] = [(r["loss"], r["grad_norm"]) for r in trainer.train()]
            mesh = tuple(trainer.mesh.shape)
    finally:
        dist.destroy_process_group()
    return losses, mesh


LAYOUTS = ("standard", "parallel", "ladder")


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    return run_ranks(train_losses, 1, LAYOUTS, 2, str(tmp_path_factory.mktemp("one")))[0]


def assert_same(a, b, tol):
    for (loss_a, norm_a), (loss_b, norm_b) in zip(a, b, strict=True):
        assert loss_a == pytest.approx(loss_b, abs=tol)
        assert norm_a == pytest.approx(norm_b, abs=tol)


def test_single_process_learns(single_process):
    losses, mesh = single_process
    assert mesh == (1, 1)
    for residual in LAYOUTS:
        trajectory = [loss for loss, _ in losses[residual]]
        assert len(trajectory) == STEPS
        assert trajectory[0] == pytest.approx(math.log(VOCAB), abs=0.1)  # small init: uniform predictions
        assert all(math.isfinite(x) for x in trajectory)
    # the layouts are different functions, so their trajectories differ
    assert losses["standard"][-1][0] != losses["ladder"][-1][0]


@pytest.mark.slow
def test_fsdp_two_processes_matches_one(single_process, tmp_path):
    results = run_ranks(train_losses, 2, LAYOUTS, 2, str(tmp_path))
    losses, mesh = results[0]
    assert mesh == (1, 2)  # default: shard over the node's processes
    for residual in LAYOUTS:
        assert_same(losses[residual], single_process[0][residual], 1e-5)
    assert results[1][0] == losses  # every rank logs the same global numbers


@pytest.mark.slow
def test_hsdp_2x2_matches_one(single_process, tmp_path):
    results = run_ranks(train_losses, 4, LAYOUTS, 2, str(tmp_path), local_world_size=2)
    losses, mesh = results[0]
    assert mesh == (2, 2)  # replicate across the two "nodes", shard inside each
    for residual in LAYOUTS:
        assert_same(losses[residual], single_process[0][residual], 1e-5)


@pytest.mark.slow
def test_gradient_accumulation_1x4_equals_4x1(tmp_path):
    one_by_four = run_ranks(train_losses, 1, ("ladder",), 2, str(tmp_path / "a"))[0][0]["ladder"]  # 4 micro of 2
    four_by_one = run_ranks(train_losses, 1, ("ladder",), 8, str(tmp_path / "b"))[0][0]["ladder"]  # 1 micro of 8
    assert_same(one_by_four, four_by_one, 1e-5)


@pytest.mark.slow
def test_plain_data_parallel_accumulating(single_process, tmp_path):
    """dp_shard=1: pure replication, with the cross-replica all-reduce deferred to the last micro-batch."""
    losses, mesh = run_ranks(train_losses, 2, ("ladder",), 2, str(tmp_path), 2, 1)[0]
    assert mesh == (2, 1)
    assert_same(losses["ladder"], single_process[0]["ladder"], 1e-5)


def test_schedule_formula():
    warmup, total, peak_ratio = 2000, 25000, 0.1
    assert lr_factor(1, warmup, total, peak_ratio) == pytest.approx(1 / 2000)
    assert lr_factor(warmup, warmup, total, peak_ratio) == 1.0
    midpoint = warmup + (total - warmup) // 2
    assert lr_factor(midpoint, warmup, total, peak_ratio) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_factor(total, warmup, total, peak_ratio) == pytest.approx(0.1)
    assert lr_factor(total + 100, warmup, total, peak_ratio) == pytest.approx(0.1)
    cfg = load_config(
        REPO / "recipes" / "paper.yaml", ["train.schedule.warmup_tokens=8e9", "train.schedule.total_tokens=100e9"]
    )
    assert resolve_schedule_steps(cfg.train.schedule, 2048 * 2048) == (1908, 23842)


@pytest.mark.slow
def test_metrics_file_follows_schedule(tmp_path):
    run_ranks(train_losses, 1, ("parallel",), 2, str(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "parallel" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    expected = [3e-3 * lr_factor(n, 2, 10, 0.1) for n in range(1, 6)]
    assert [r["lr"] for r in records] == pytest.approx(expected)
    assert records[-1]["tokens"] == 5 * GLOBAL * SEQ
    assert all(r["mfu"] is None and r["tokens_per_s"] > 0 and 0 <= r["data_wait_frac"] < 1 for r in records)
    saved = load_config(tmp_path / "parallel" / "config.yaml")
    assert saved.model.residual == "parallel" and saved.train.max_steps == STEPS


@pytest.mark.slow
def test_smoke_recipe_loss_falls(tmp_path):
    """The shipped smoke recipe, as a user runs it (one process, offline), shortened to 60 steps."""
    cmd = [sys.executable, "-m", "ladder_train.train", "--config", str(REPO / "recipes" / "smoke.yaml")]
    cmd += [f"run.dir={tmp_path}", "train.max_steps=60", "train.schedule.total_steps=60", "train.log_every=10"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(losses) == [10, 20, 30, 40, 50, 60]
    assert losses[10] < math.log(257)  # already below uniform guessing over the 257 byte tokens
    assert losses[60] < losses[10] - 1.0  # and learns: more than a nat below its first logged loss
    assert losses[60] < 3.5


def test_dry_run_3b_plan_on_16_nodes():
    cfg = load_config(REPO / "recipes" / "standard_3b.yaml")
    plan = dry_run(cfg, "16x8")
    assert "mesh (16, 8)" in plan
    params = 3_510_819_072
    line = next(x for x in plan.splitlines() if x.startswith("memory per GPU"))
    acts = float(line.split("activations ")[1].split()[0]) + float(line.split("logits ")[1].split()[0])
    total = float(line.split("total ")[1])
    expected = 16 * params / 8 / 2**30 + acts
    assert abs(total - expected) / expected < 0.10, (total, expected)
    assert f"{params // 8:,} per GPU" in plan


def train_with_poisoned_batches(tmp, skips, poisoned_steps):
    """Train with a huge input at some steps: NaN loss there (a model overflow stand-in)."""
    from ladder_train.parallel import init_distributed
    from ladder_train.train import NonFiniteLossError, Trainer

    env = init_distributed()
    cfg = tiny_config("ladder", 8, tmp, **{"train.max_nonfinite_skips": skips})
    trainer = Trainer(cfg, env, batches=global_batches(0, 1, 8))
    embed = trainer.model.tok_embeddings.weight
    original_forward = trainer.model.forward

    def forward(ids):  # poison the logits on chosen steps
        logits = original_forward(ids)
        return logits * float("nan") if trainer.step + 1 in poisoned_steps else logits

    trainer.model.forward = forward
    try:
        history = trainer.train()
        outcome = ("finished", [r["step"] for r in history], bool(embed.isfinite().all()))
    except NonFiniteLossError as err:
        outcome = ("stopped", str(err), trainer.step)
    dist.destroy_process_group()
    return outcome


@pytest.mark.slow
def test_nonfinite_loss_stops_with_the_step(tmp_path):
    kind, message, step = run_ranks(train_with_poisoned_batches, 1, str(tmp_path), 0, {3})[0]
    assert kind == "stopped" and step == 3
    assert message.startswith("step 3: loss nan") and "train.max_nonfinite_skips=0" in message


@pytest.mark.slow
def test_nonfinite_steps_skipped_up_to_the_limit(tmp_path):
    kind, steps, weights_finite = run_ranks(train_with_poisoned_batches, 1, str(tmp_path / "a"), 2, {2, 4})[0]
    assert kind == "finished" and steps == [1, 2, 3, 4, 5] and weights_finite  # skipped updates left no NaN
    kind, message, step = run_ranks(train_with_poisoned_batches, 1, str(tmp_path / "b"), 1, {2, 4})[0]
    assert kind == "stopped" and step == 4


def test_wandb_online_without_credentials_falls_back_to_offline(tmp_path, monkeypatch, capsys):
    from ladder_train.train.metrics import MetricLogger

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    cfg = tiny_config("standard", 8, str(tmp_path / "run"), **{"wandb.mode": "online"})
    logger = MetricLogger(cfg, tmp_path / "run", is_main=True)
    try:
        assert logger.wandb_run is not None and logger.wandb_run.settings.mode == "offline"
        assert logger.wandb_run.config["model"]["residual"] == "standard"  # the resolved config is logged
        logger.log({"step": 1, "loss": 1.5, "lr": 1e-3, "grad_norm": 0.5}, console=False)
    finally:
        logger.close()
    assert "online init failed" in capsys.readouterr().err
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["loss"] == 1.5


def test_metrics_rows_carry_their_wall_clock_time_in_utc(tmp_path):
    from datetime import datetime, timedelta

    from ladder_train.train.metrics import MetricLogger

    cfg = tiny_config("standard", 8, str(tmp_path / "run"))
    logger = MetricLogger(cfg, tmp_path / "run", is_main=True)
    before = datetime.now(UTC).replace(microsecond=0)
    logger.log({"step": 1, "loss": 1.5}, console=False)
    logger.log({"step": 2, "loss": 1.4}, console=False)
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    stamps = [datetime.fromisoformat(row["time"]) for row in rows]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(s.utcoffset() == timedelta(0) for s in stamps)
    assert before <= stamps[0] <= stamps[1] <= datetime.now(UTC)


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


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_loader_workers_die_with_a_killed_trainer(tmp_path):
    import signal
    import time

    # batches of 8 x 2048 tokens (~260 kB) fill the worker -> trainer pipe, where an orphaned worker used to
    # block forever (the trainer is slow to take them: each step trains on one)
    cmd = [
        sys.executable,
        "-u",
        "-m",
        "ladder_train.train",
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={tmp_path / 'run'}",
        "model.max_seq_len=2048",
        "data.seq_len=2048",
        "data.num_workers=2",
        "train.micro_batch_size=8",
        "train.max_steps=1000",
        "train.log_every=1",
    ]
    trainer = subprocess.Popen(
        cmd,
        env={**os.environ, **OFFLINE},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
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
        assert not _survivors(workers, seconds=4), "loader workers outlived the killed trainer"
    finally:
        trainer.kill()
        for pid in workers:  # orphans of a failed run: ours to end
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_torchrun_with_sigusr1_forwarding_saves_and_ends_its_ranks(tmp_path):
    """What the README says to expect: the rank saves and exits 75, torchrun itself exits 1."""
    import signal
    import time

    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=1",
        "--signals-to-handle",
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "-m",
        "ladder_train.train",
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={run_dir}",
        "train.max_steps=2000",
        "train.log_every=1",
        "data.num_workers=0",
    ]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **OFFLINE},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
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


# -- the evaluator: lm-eval at the end of a run, and ranks that wait for it ---------------------------------


def test_the_evaluator_decides_its_steps(tmp_path):
    from ladder_train.train.evaluator import Evaluator

    settings = {"eval.val_every": 4, "eval.every": 2, "checkpoint.every": 3, "eval.tasks": "[fake_task]"}
    evaluator = Evaluator(tiny_config("ladder", 8, str(tmp_path), **settings), None, tmp_path, None, 2, None)
    assert [s for s in range(1, 13) if evaluator.should_validate(s)] == [4, 8, 12]
    assert evaluator.should_validate(10, last=True)  # the run's last step, validated once
    evaluator.validate(None, 10, 0, None)  # no tokenizer (fixed batches): nothing to validate, but it is done
    assert not evaluator.should_validate(10, last=True)
    # lm-eval on every second periodic checkpoint (3, 6, 9, 12: 6 and 12) and the final one
    assert [s for s in (3, 6, 9, 12) if evaluator.should_evaluate(s)] == [6, 12]
    assert evaluator.should_evaluate(13, last=True)
    quiet = Evaluator(tiny_config("ladder", 8, str(tmp_path), **{"eval.at_end": False}), None, tmp_path, None, 2, None)
    assert not quiet.should_evaluate(13, last=True) and not quiet.should_validate(13, last=True)


@pytest.mark.slow
def test_smoke_run_ends_with_an_evaluation(shared_dir, tmp_path):
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "ladder_train.train",
        "--config",
        str(REPO / "recipes" / "smoke.yaml"),
        f"run.dir={run_dir}",
    ]
    cmd += ["train.max_steps=12", "train.log_every=4", "eval.at_end=true", "eval.tasks=[arc_easy_local,piqa_local]"]
    cmd += [f"eval.local_data={shared_dir / 'eval'}", "eval.limit=8", "wandb.mode=offline"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    saved = json.loads((run_dir / "eval" / "step-12.json").read_text())
    summary = saved["summary"]
    assert set(summary) == {"arc_easy_local", "piqa_local"} and saved["limit"] == 8
    for metrics in summary.values():
        assert 0 <= metrics["acc"] <= 1 and 0 <= metrics["acc_norm"] <= 1
    # the same numbers went to metrics.jsonl and to the wandb run (offline file), under eval/<task>/<metric>
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    eval_record = next(r for r in logged if "eval/arc_easy_local/acc" in r)
    assert eval_record["step"] == 12
    assert eval_record["eval/arc_easy_local/acc"] == summary["arc_easy_local"]["acc"]
    assert eval_record["eval/piqa_local/acc_norm"] == summary["piqa_local"]["acc_norm"]
    wandb_file = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert b"eval/piqa_local/acc_norm" in wandb_file.read_bytes()

    # ladder-eval on the final training checkpoint writes beside the run's other evaluations
    checkpoint = run_dir / "checkpoints" / "step-12"
    ladder_eval = "import sys; from ladder_train.cli import ladder_eval; sys.exit(ladder_eval())"
    cmd = [sys.executable, "-c", ladder_eval, str(checkpoint), "--tasks", "arc_easy_local"]
    cmd += ["--local-data", str(shared_dir / "eval"), "--limit", "8", "--out", str(tmp_path / "again.json")]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    again = json.loads((tmp_path / "again.json").read_text())["summary"]
    assert again["arc_easy_local"] == summary["arc_easy_local"]  # same weights, same rows, same numbers


# -- a slow in-process eval on rank 0 outlasts the collective timeout -------------------------------------

SLOW_EVAL_S = 14


def _train_with_slow_eval(run_dir: str) -> tuple[int, list[str]]:
    import time

    import ladder_train.evaluation as evaluation
    from ladder_train.cli import main

    def slow_evaluate(model, tokenizer, tasks, out_path=None, **kwargs):
        time.sleep(SLOW_EVAL_S)  # rank 0 only: longer than parallel.timeout_s below
        return {"fake_task": {"acc": 0.5}}

    evaluation.evaluate = slow_evaluate
    argv = [
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={run_dir}",
        "parallel.timeout_s=5",
        "train.max_steps=2",
        "train.log_every=1",
        "data.num_workers=0",
        "eval.at_end=true",
        "eval.tasks=[fake_task]",
        "wandb.mode=disabled",
    ]
    code = main(argv)
    return code, sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir())


@pytest.mark.slow
def test_ranks_wait_for_a_slow_rank0_eval_beyond_the_collective_timeout(tmp_path):
    results = run_ranks(_train_with_slow_eval, 2, str(tmp_path / "run"))
    assert results == [(0, ["step-2"]), (0, ["step-2"])]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("eval/fake_task/acc") == 0.5 for r in logged)  # the eval did run, on rank 0


# -- signals: every preemption signal saves and exits 75; ranks and workers end with their launcher ----------


def _survivors(pids: set[int], seconds: float) -> list[int]:
    """The processes of ``pids`` still running after waiting up to ``seconds`` for them to end."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _running(p)]


def _descendants(pid: int) -> set[int]:
    found, frontier = set(), {pid}
    while frontier:
        children = set().union(*(_children(p) for p in frontier if _running(p)))
        frontier = children - found
        found |= children
    return found


def _wait_for_steps(proc, metrics: Path, count: int, seconds: float = 300) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= count):
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGHUP"])
def test_ctrl_c_and_hangup_save_and_exit_75_like_sigterm(tmp_path, sig):
    import signal

    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "ladder_train.train",
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={run_dir}",
        "train.max_steps=5000",
        "train.log_every=1",
        "data.num_workers=1",
    ]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **OFFLINE},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_steps(proc, run_dir / "metrics.jsonl", 3)
        os.killpg(proc.pid, getattr(signal, sig))  # the whole process group, as a terminal's Ctrl-C or hangup does
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 75, err[-2000:]
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("ladder-train")]
    assert line.startswith("ladder-train: preempted: stopped by a signal after step")
    step = int(line.split("after step ")[1].split(";")[0])
    assert (run_dir / "checkpoints" / f"step-{step}" / "COMPLETE").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_kill_9_of_torchrun_ends_every_rank_and_worker_and_the_run_resumes(tmp_path):
    import signal

    run_dir = tmp_path / "run"
    base = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "ladder_train.train",
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={run_dir}",
        "train.log_every=1",
        "data.num_workers=1",
        "checkpoint.every=5",
    ]
    proc = subprocess.Popen(
        [*base, "train.max_steps=5000"],
        env={**os.environ, **OFFLINE},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    run = set()
    try:
        _wait_for_steps(proc, run_dir / "metrics.jsonl", 7)
        run = _descendants(proc.pid)  # two ranks and their loader workers
        assert len(run) >= 4, run
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert not _survivors(run, seconds=10), "processes of the run outlived torchrun"
    finally:
        for pid in [proc.pid, *run]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    saved = max(
        int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*") if (p / "COMPLETE").is_file()
    )
    done = subprocess.run(
        [*base, f"train.max_steps={saved + 2}"],
        env={**os.environ, **OFFLINE},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / f'step-{saved}'} at step {saved}" in done.stdout


@pytest.mark.slow
def test_a_run_refused_as_bad_input_leaves_no_run_folder(tmp_path):
    run_dir = tmp_path / "new_run"
    cmd = [
        sys.executable,
        "-m",
        "ladder_train.train",
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={run_dir}",
        f"data.source={tmp_path / 'missing'}",
    ]
    done = subprocess.run(cmd, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("ladder-train: error: ")
    assert str(tmp_path / "missing") in done.stderr
    assert not run_dir.exists()  # neither run.lock nor config.yaml stays behind


# MFU: the peak by exact card (a PCIe or NVL H100 is not the SXM card's 989.4 TF) and frozen layers not counted
@pytest.mark.parametrize(
    "card, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
    ],
)
def test_mfu_peak_by_exact_card(monkeypatch, card, peak):
    from ladder_train.train.metrics import device_peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    assert device_peak_flops(torch.device("cuda", 0)) == pytest.approx(peak, rel=1e-12)
    assert device_peak_flops(torch.device("cpu")) is None  # MFU null on the CPU


def test_mfu_of_an_unknown_card_is_null_with_one_note(monkeypatch, capsys):
    from ladder_train.train import metrics

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 test-variant")
    monkeypatch.setattr(metrics, "_UNKNOWN_CARDS", set())
    assert metrics.device_peak_flops(torch.device("cuda", 0)) is None
    assert metrics.device_peak_flops(torch.device("cuda", 1)) is None
    assert capsys.readouterr().err.count("no bf16 peak known for 'NVIDIA H100 test-variant'") == 1


def test_flops_per_token_of_frozen_layers():
    from ladder_train.model import flops_per_token, preset_args

    # tiny: 2 layers, dim 64, 4 heads (head dim 16, 4 kv heads), FFN 176, vocab 49,152, untied head, standard.
    # block matmuls 64 x 16 x 16 (q, k, v, o) + 3 x 64 x 176 = 16,384 + 33,792 = 50,176; norms 2 x 2 x 64 + 64;
    # blocks + norms + head = 100,672 + 3,145,728 = 3,246,400; attention at seq 128: 12 x 2 x 64 x 128 = 196,608
    args = preset_args("tiny")
    assert flops_per_token(args, 128) == 6 * 3_246_400 + 196_608 == 19_675_008
    # a frozen block skips its weight gradients: 4 x 50,176 instead of 6 x (input gradients still flow to the
    # trainable embeddings); its attention scores and values keep their 12 x dim x seq
    assert flops_per_token(args, 128, frozen_layers=1) == 19_675_008 - 2 * 50_176 == 19_574_656
    assert flops_per_token(args, 128, frozen_layers=2) == 19_474_304


@pytest.mark.slow
def test_trainer_meter_counts_frozen_layers(tmp_path):
    from ladder_train.model import flops_per_token
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        cfg = tiny_config("ladder", 8, str(tmp_path), **{"train.freeze_layers": 1})
        trainer = Trainer(cfg, env, batches=global_batches(0, 1, 8))
        frozen = flops_per_token(trainer.model_args, SEQ, frozen_layers=1)
        assert trainer.meter.flops_per_token == frozen < flops_per_token(trainer.model_args, SEQ)
    finally:
        dist.destroy_process_group()


# -- compile per block + FSDP2 + activation checkpointing (recipes/paper.yaml), on aot_eager -------------------


def _train_compiled(tmp: str, runs) -> dict:
    """Per (activation_checkpoint, compile) run: the per-step (loss, grad norm), dynamo's graph breaks and
    unique graphs, and whether the root's tied embedding was sharded after each forward."""
    os.environ["LADDER_COMPILE_BACKEND"] = "aot_eager"  # autograd traced as inductor would see it, no codegen
    from torch._dynamo.utils import counters
    from torch.distributed.tensor import DTensor

    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    results = {}
    try:
        for ac, compiled in runs:
            torch._dynamo.reset()
            counters.clear()
            overrides = {"model.n_layers": 4, "parallel.activation_checkpoint": ac, "parallel.compile": compiled}
            cfg = tiny_config("ladder", 2, f"{tmp}/{ac}-{compiled}", **overrides)
            trainer = Trainer(cfg, env, batches=global_batches(env.rank, env.world_size, 2))
            sharded_after_forward = []
            trainer.model.register_forward_hook(  # runs after FSDP's own post-forward hook
                lambda module, args, out, seen=sharded_after_forward: seen.append(
                    isinstance(module.tok_embeddings.weight, DTensor)
                )
            )
            losses = [(r["loss"], r["grad_norm"]) for r in trainer.train()]
            graphs = counters["stats"]["unique_graphs"]
            results[ac, compiled] = losses, dict(counters["graph_break"]), graphs, sharded_after_forward
    finally:
        dist.destroy_process_group()
    return results


@pytest.mark.slow
def test_compiled_checkpointed_fsdp_blocks_match_eager(tmp_path):
    """4 ladder layers on 2 ranks, each block compiled (aot_eager) inside its checkpoint wrapper and sharded:
    no graph break, one graph per kind of block (first or not, checkpointed or not: 2 with every block
    checkpointed, 3 with every_n at ac_every=2), whatever the layers or steps; and the eager numbers."""
    runs = [(ac, compiled) for ac in ("full", "every_n") for compiled in (False, True)]
    results = run_ranks(_train_compiled, 2, str(tmp_path), runs)
    assert results[0] == results[1]  # every rank logs the same global numbers and compiles the same graphs
    for ac, bound in (("full", 2), ("every_n", 3)):
        eager, _, eager_graphs, _ = results[0][ac, False]
        compiled, breaks, graphs, sharded_after_forward = results[0][ac, True]
        assert eager_graphs == 0
        assert breaks == {}
        assert 1 <= graphs <= bound
        assert len(compiled) == STEPS
        for (loss_c, norm_c), (loss_e, norm_e) in zip(compiled, eager, strict=True):
            assert loss_c == pytest.approx(loss_e, rel=1e-5)
            assert norm_c == pytest.approx(norm_e, rel=1e-5)
        # the root keeps the tied embedding gathered from forward into backward, which needs it first
        assert sharded_after_forward and not any(sharded_after_forward)
