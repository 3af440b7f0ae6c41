"""The training loop under FSDP2/HSDP on gloo: sharding, accumulation and the schedule change nothing
but speed; the smoke recipe learns; the dry-run plan of the 3.5B recipe; non-finite losses; compiled,
checkpointed FSDP blocks give the eager numbers. Helpers shared by the other tests/test_train_*.py files."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from tiny import tiny_run_config

from ladder_train.config import load_config
from ladder_train.train.memory_plan import dry_run
from ladder_train.train.optim import lr_factor, resolve_schedule_steps

REPO = Path(__file__).resolve().parents[1]
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
    losses, chosen = {}, {}
    try:
        for residual in layouts:
            mesh_keys = {"parallel.dp_replicate": replicate, "parallel.dp_shard": shard}
            layout_keys = {"model.desync_tp": 2} if residual == "desync" else {}  # two emulated TP streams
            cfg = tiny_config(residual, micro, f"{tmp}/{residual}", **mesh_keys, **layout_keys)
            trainer = Trainer(cfg, env, batches=global_batches(env.rank, env.world_size, micro))
            losses[residual] = [(r["loss"], r["grad_norm"]) for r in trainer.train()]
            mesh = tuple(trainer.mesh.shape)
            if env.is_main:  # rank 0 writes the run's summary: finished, and the accumulation FSDP was given
                summary = json.loads((trainer.run_dir / "summary.json").read_text())
                chosen[residual] = (summary["finished"], summary["step"], summary["fsdp_gradients"])
    finally:
        dist.destroy_process_group()
    return losses, mesh, chosen


LAYOUTS = ("standard", "parallel", "ladder", "desync")


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    return run_ranks(train_losses, 1, LAYOUTS, 2, str(tmp_path_factory.mktemp("one")))[0]


def assert_same(a, b, tol):
    for (loss_a, norm_a), (loss_b, norm_b) in zip(a, b, strict=True):
        assert loss_a == pytest.approx(loss_b, abs=tol)
        assert norm_a == pytest.approx(norm_b, abs=tol)


@pytest.mark.slow
def test_single_process_learns(single_process):
    losses, mesh, chosen = single_process
    assert mesh == (1, 1)
    assert chosen == {residual: (True, STEPS, "none") for residual in LAYOUTS}  # one fp32 process: no FSDP
    for residual in LAYOUTS:
        trajectory = [loss for loss, _ in losses[residual]]
        assert len(trajectory) == STEPS
        assert trajectory[0] == pytest.approx(math.log(VOCAB), abs=0.1)  # small init: uniform predictions
        assert all(math.isfinite(x) for x in trajectory)
    # the layouts are different functions, so their trajectories differ
    assert losses["standard"][-1][0] != losses["ladder"][-1][0] != losses["desync"][-1][0]


@pytest.mark.slow
def test_fsdp_two_processes_matches_one(single_process, tmp_path):
    results = run_ranks(train_losses, 2, LAYOUTS, 2, str(tmp_path))
    losses, mesh, chosen = results[0]
    assert mesh == (1, 2)  # default: shard over the node's processes
    assert chosen == {residual: (True, STEPS, "unsharded") for residual in LAYOUTS}  # auto, on the CPU
    assert results[1][2] == {}  # only rank 0 writes the summary
    for residual in LAYOUTS:
        assert_same(losses[residual], single_process[0][residual], 1e-5)
    assert results[1][0] == losses  # every rank logs the same global numbers


@pytest.mark.slow
def test_hsdp_2x2_matches_one(single_process, tmp_path):
    results = run_ranks(train_losses, 4, LAYOUTS, 2, str(tmp_path), local_world_size=2)
    losses, mesh, _ = results[0]
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
    losses, mesh, _ = run_ranks(train_losses, 2, ("ladder",), 2, str(tmp_path), 2, 1)[0]
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

    def forward(ids, labels=None):  # poison the loss on chosen steps
        loss = original_forward(ids, labels=labels)
        return loss * float("nan") if trainer.step + 1 in poisoned_steps else loss

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
    checkpointed, 3 with every_n at ac_every=2) and one of the loss, whatever the layers or steps; and the eager
    numbers."""
    runs = [(ac, compiled) for ac in ("full", "every_n") for compiled in (False, True)]
    results = run_ranks(_train_compiled, 2, str(tmp_path), runs)
    assert results[0] == results[1]  # every rank logs the same global numbers and compiles the same graphs
    for ac, bound in (("full", 2 + 1), ("every_n", 3 + 1)):  # the blocks', then the loss's
        eager, _, eager_graphs, _ = results[0][ac, False]
        compiled, breaks, graphs, sharded_after_forward = results[0][ac, True]
        assert eager_graphs == 0
        assert breaks == {}
        assert 2 <= graphs <= bound
        assert len(compiled) == STEPS
        for (loss_c, norm_c), (loss_e, norm_e) in zip(compiled, eager, strict=True):
            assert loss_c == pytest.approx(loss_e, rel=1e-5)
            assert norm_c == pytest.approx(norm_e, rel=1e-5)
        # the root keeps the tied embedding gathered from forward into backward, which needs it first
        assert sharded_after_forward and not any(sharded_after_forward)
