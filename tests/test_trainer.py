"""The training loop under FSDP2/HSDP on gloo: sharding, accumulation and the schedule change nothing
but speed; the smoke recipe learns; the dry-run plan of the 3.5B recipe."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks

from ladder_train.config import load_config
from ladder_train.train.optim import lr_factor, resolve_schedule_steps
from ladder_train.train.plan import dry_run

REPO = Path(__file__).resolve().parents[1]
SEQ, GLOBAL, VOCAB, STEPS = 16, 8, 256, 5


def tiny_config(residual: str, micro: int, tmp: str, **extra):
    overrides = {
        "run.dir": tmp,
        "model.vocab_size": VOCAB,
        "model.dim": 32,
        "model.n_layers": 2,
        "model.n_heads": 4,
        "model.ffn_dim": 64,
        "model.max_seq_len": SEQ,
        "model.residual": residual,
        "data.seq_len": SEQ,
        "train.global_batch_size": GLOBAL,
        "train.micro_batch_size": micro,
        "train.max_steps": STEPS,
        "train.log_every": 1,
        "train.optimizer.lr": 3e-3,
        "train.schedule.warmup_steps": 2,
        "train.schedule.total_steps": 10,
        "wandb.mode": "disabled",
        **extra,
    }
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()])


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


def test_fsdp_two_processes_matches_one(single_process, tmp_path):
    results = run_ranks(train_losses, 2, LAYOUTS, 2, str(tmp_path))
    losses, mesh = results[0]
    assert mesh == (1, 2)  # default: shard over the node's processes
    for residual in LAYOUTS:
        assert_same(losses[residual], single_process[0][residual], 1e-5)
    assert results[1][0] == losses  # every rank logs the same global numbers


def test_hsdp_2x2_matches_one(single_process, tmp_path):
    results = run_ranks(train_losses, 4, LAYOUTS, 2, str(tmp_path), local_world_size=2)
    losses, mesh = results[0]
    assert mesh == (2, 2)  # replicate across the two "nodes", shard inside each
    for residual in LAYOUTS:
        assert_same(losses[residual], single_process[0][residual], 1e-5)


def test_gradient_accumulation_1x4_equals_4x1(tmp_path):
    one_by_four = run_ranks(train_losses, 1, ("ladder",), 2, str(tmp_path / "a"))[0][0]["ladder"]  # 4 micro of 2
    four_by_one = run_ranks(train_losses, 1, ("ladder",), 8, str(tmp_path / "b"))[0][0]["ladder"]  # 1 micro of 8
    assert_same(one_by_four, four_by_one, 1e-5)


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


def test_nonfinite_loss_stops_with_the_step(tmp_path):
    kind, message, step = run_ranks(train_with_poisoned_batches, 1, str(tmp_path), 0, {3})[0]
    assert kind == "stopped" and step == 3
    assert message.startswith("step 3: loss nan") and "train.max_nonfinite_skips=0" in message


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
