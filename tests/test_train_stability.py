"""Loss spikes (train.spike) and the warmup-stable-decay schedule (train.schedule.kind=wsd): the detector's
statistic, each action on an injected spike (log trains on unchanged, skip leaves the weights as they were, stop
records the batch and a restart resumes from the last checkpoint without it), the wsd formula, a resumed or
extended schedule, and the config's refusals."""

import contextlib
import io
import json
import math
import statistics

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from test_train import GLOBAL, SEQ, VOCAB, tiny_config

from ladder_train.config import ConfigError, load_config
from ladder_train.train.optim import apply_schedule, build_optimizer, build_scheduler, lr_factor, wsd_factor
from ladder_train.train.stability import (
    MIN_RELATIVE_STD,
    LossSpikeStop,
    NonFiniteLossError,
    SpikeDetector,
    StabilityGuard,
    Verdict,
)

# -- the detector ------------------------------------------------------------------------------------------------


def test_spike_detector_z_score_over_the_window():
    detector = SpikeDetector(window=4, threshold=6.0, watch=["loss", "grad_norm"])
    losses, norms = [3.0, 3.1, 2.9, 3.0], [1.0, 1.2, 0.8, 1.1]
    for loss, norm in zip(losses, norms, strict=True):  # nothing fires while the window fills
        assert detector.observe({"loss": loss, "grad_norm": norm}) is None
    # a loss 0.5 above the window's mean: z = 0.5 / sample sd (0.0816...) = 6.12 > 6, the norm's z is 0
    z = detector.observe({"loss": 3.5, "grad_norm": statistics.mean(norms)})
    assert z["loss"] == pytest.approx(0.5 / statistics.stdev(losses)) and z["loss"] > 6
    assert z["grad_norm"] == pytest.approx(0.0, abs=1e-9)
    # the spike joined the window (3.1, 2.9, 3.0, 3.5): a second 3.5 is now within 6 sd
    assert detector.observe({"loss": 3.5, "grad_norm": 1.0}) is None
    assert list(detector.history["loss"]) == [2.9, 3.0, 3.5, 3.5]


def test_spike_detector_is_one_sided_and_floors_the_deviation():
    detector = SpikeDetector(window=3, threshold=6.0, watch=["loss"])
    for _ in range(3):
        detector.observe({"loss": 2.0})  # a flat window: sd 0, floored at 1 % of the mean (0.02)
    assert detector.z_scores({"loss": 2.1}) == {"loss": pytest.approx(0.1 / (MIN_RELATIVE_STD * 2.0))}
    assert detector.observe({"loss": 2.1}) is None  # z = 5: within the threshold
    assert detector.observe({"loss": 0.5}) is None  # a drop is never a spike
    restored = SpikeDetector(window=3, threshold=6.0, watch=["loss"])
    restored.load_state_dict(detector.state_dict())
    assert restored.z_scores({"loss": 9.0}) == detector.z_scores({"loss": 9.0})  # a resume judges alike


# -- the guard's verdict: one call per step --------------------------------------------------------------------


def guard_of(tmp_path, **overrides) -> StabilityGuard:
    settings = {"train.spike.window": 3, "train.spike.threshold": 6, **overrides}
    return StabilityGuard(tiny_config("ladder", 8, str(tmp_path), **settings).train, tmp_path, is_main=True)


def test_the_verdict_skips_nonfinite_updates_up_to_the_limit_then_fails(tmp_path, capsys):
    guard = guard_of(tmp_path, **{"train.max_nonfinite_skips": 1})
    assert guard.judge(1, 2.0, 1.0) == Verdict(update=True)  # detector off: no spike count either
    skipped = guard.judge(2, math.nan, 1.0)
    assert (
        skipped == Verdict(update=False) and "step 2: loss nan / grad norm 1.0 is not finite" in capsys.readouterr().out
    )
    failed = guard.judge(3, 2.0, math.inf)
    assert not failed.update and isinstance(failed.fail, NonFiniteLossError) and failed.stop is None
    assert str(failed.fail).startswith("step 3: loss 2.0 / grad norm inf is not finite; stopping")
    assert guard.state_dict()["nonfinite_skips"] == 2


@pytest.mark.parametrize("action, update", [("log", True), ("skip", False), ("stop", False)])
def test_the_verdict_of_a_spike_under_each_action(tmp_path, action, update):
    guard = guard_of(tmp_path, **{"train.spike.enabled": True, "train.spike.action": action})
    for step in (1, 2, 3):
        assert guard.next_global_batch(lambda: None) == step
        assert guard.judge(step, 2.0 + step / 100, 1.0) == Verdict(update=True, spikes=0)
    guard.next_global_batch(lambda: None)
    verdict = guard.judge(4, 50.0, 1.0)
    assert verdict.update is update and verdict.spikes == 1 and verdict.spike_z["loss"] > 6
    assert verdict.record() == {"spike": 1, "spike_z_loss": verdict.spike_z["loss"], "spike_z_grad_norm": 0.0}
    assert verdict.counts() == {"spikes": 1}
    assert isinstance(verdict.stop, LossSpikeStop) is (action == "stop")
    recorded = tmp_path / "skip_batches.json"
    assert recorded.is_file() is (action == "stop")
    if action == "stop":  # a restart's guard drops batch 4 before its step, whatever the step counter says
        assert json.loads(recorded.read_text())["batches"] == [4]
        restarted = guard_of(tmp_path, **{"train.spike.enabled": True, "train.spike.action": action})
        restarted.load_state_dict({**guard.state_dict(), "batches_drawn": 3})
        dropped = []
        assert restarted.next_global_batch(lambda: dropped.append(4)) == 5 and dropped == [4]


# -- spikes in training: fixed, numbered batches and a poisoned one -----------------------------------------------


class NumberedBatches:
    """This rank's micro-batches of fixed global batches; every token of column 0 is the global batch's number
    (1-based). A MicroBatchLoader with a per-rank position, like the on-the-fly loader: the trainer saves and
    restores ``state_dict``."""

    def __init__(self, rank: int, world: int, micro: int):
        self.rank, self.world, self.micro = rank, world, micro
        self.position = 0  # micro-batches handed out

    def __iter__(self):
        per_rank = GLOBAL // self.world
        micro_per_step = per_rank // self.micro
        while True:
            number, part = divmod(self.position, micro_per_step)
            tokens = torch.randint(0, VOCAB, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(number + 1))
            tokens[:, 0] = number + 1
            mine = tokens[self.rank * per_rank : (self.rank + 1) * per_rank][
                part * self.micro : (part + 1) * self.micro
            ]
            self.position += 1
            yield mine[:, :-1], mine[:, 1:]

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict | None) -> None:
        self.position = 0 if state is None else state["position"]

    def global_state(self) -> None:
        return None

    def load_global_state(self, state: dict | None) -> None:
        assert state is None

    def describe(self) -> str:
        return f"numbered batches from micro-batch {self.position}"

    def close(self) -> None:
        pass


def spiky_trainer(env, run_dir: str, poisoned: set[int], trained: list[int], **overrides):
    """A 2-layer ladder on NumberedBatches whose loss is scaled 1000x on the poisoned global batches (a finite
    loss spike); ``trained`` collects the number of every batch a forward ran on."""
    from ladder_train.train import Trainer

    settings = {
        "train.max_steps": 10,
        "train.schedule.total_steps": 10,
        "train.spike.enabled": True,
        "train.spike.window": 4,
        "train.spike.threshold": 20,
        **overrides,
    }
    cfg = tiny_config("ladder", 8 // env.world_size, run_dir, **settings)
    trainer = Trainer(cfg, env, batches=NumberedBatches(env.rank, env.world_size, 8 // env.world_size))
    original_forward = trainer.model.forward

    def forward(ids, labels=None):
        number = int(ids[0, 0])
        trained.append(number)
        loss = original_forward(ids, labels=labels)
        return loss * 1000.0 if number in poisoned else loss

    trainer.model.forward = forward
    return trainer


def local_weights(model) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return [(p.to_local() if isinstance(p, DTensor) else p).detach().clone() for p in model.parameters()]


def _train_with_spike(run_dir: str, action: str | None) -> dict:
    """Steps 1-10, batch 7 poisoned; per step the largest change of any weight, the records, the console."""
    from ladder_train.parallel import init_distributed

    env = init_distributed()
    overrides = {"train.spike.action": action} if action else {"train.spike.enabled": False}
    trainer = spiky_trainer(env, run_dir, {7}, [], **overrides)
    changes, real_step = [], trainer.train_step

    def measured_step():
        before = local_weights(trainer.model)
        result = real_step()
        changes.append(
            max((a - b).abs().max().item() for a, b in zip(local_weights(trainer.model), before, strict=True))
        )
        return result

    trainer.train_step = measured_step
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        history = trainer.train()
    dist.destroy_process_group()
    return {"history": history, "changes": changes, "console": console.getvalue()}


@pytest.mark.slow
def test_spike_log_reports_the_step_and_trains_on_unchanged(tmp_path):
    plain = run_ranks(_train_with_spike, 1, str(tmp_path / "off"), None)[0]
    logged = run_ranks(_train_with_spike, 1, str(tmp_path / "log"), "log")[0]
    assert [(r["loss"], r["grad_norm"]) for r in logged["history"]] == [
        (r["loss"], r["grad_norm"]) for r in plain["history"]
    ]
    assert logged["changes"] == plain["changes"] and logged["changes"][6] > 0  # the spike's update was applied
    spikes = [r["step"] for r in logged["history"] if r.get("spike")]
    assert spikes == [7]
    assert logged["history"][6]["spike_z_loss"] > 20 and "spike" not in plain["history"][6]
    assert (
        "warning: step 7: loss spike: loss" in logged["console"]
        and "training on (1 spikes so far)" in logged["console"]
    )
    records = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    assert [r["spikes"] for r in records] == [0] * 6 + [1] * 4  # the count every logger sink (wandb too) receives
    assert records[6]["spike"] == 1 and records[6]["step"] == 7


@pytest.mark.slow
def test_spike_skip_leaves_the_weights_of_that_step_on_every_rank(tmp_path):
    ranks = run_ranks(_train_with_spike, 2, str(tmp_path / "skip"), "skip")
    for result in ranks:
        changes = result["changes"]
        assert changes[6] == 0.0  # step 7: the weights after it are the weights before it
        assert all(change > 0 for i, change in enumerate(changes) if i != 6)
        assert [r["step"] for r in result["history"]] == list(range(1, 11))  # the step still counts
        assert [r["step"] for r in result["history"] if r.get("spike")] == [7]
    # the same numbers and the same decision on both ranks
    judged = [[{k: r.get(k) for k in ("loss", "grad_norm", "lr", "spike")} for r in rank["history"]] for rank in ranks]
    assert judged[0] == judged[1]
    assert "update skipped (1 spikes so far)" in ranks[0]["console"]


def _stop_and_restart(run_dir: str) -> dict:
    from ladder_train.parallel import init_distributed
    from ladder_train.train import LossSpikeStop

    env = init_distributed()
    first_batches, second_batches = [], []
    settings = {"train.spike.action": "stop", "checkpoint.every": 4, "train.max_steps": 12}
    first = spiky_trainer(env, run_dir, {7}, first_batches, **settings)
    try:
        first.train()
        stopped = None
    except LossSpikeStop as err:
        stopped = (str(err), first.step)
    second = spiky_trainer(env, run_dir, {7}, second_batches, **settings)
    resumed_at = second.step
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        history = second.train()
    dist.destroy_process_group()
    return {
        "stopped": stopped,
        "first_batches": first_batches,
        "resumed_at": resumed_at,
        "history": history,
        "second_batches": second_batches,
        "console": console.getvalue(),
    }


@pytest.mark.slow
def test_spike_stop_records_the_batch_and_the_restart_skips_it(tmp_path):
    run_dir = tmp_path / "run"
    result = run_ranks(_stop_and_restart, 1, str(run_dir))[0]
    message, stopped_at = result["stopped"]
    assert stopped_at == 7 and message.startswith("step 7: loss spike: loss")
    assert "global batch 7 is recorded in" in message and "rerun the command" in message
    assert result["first_batches"] == [1, 2, 3, 4, 5, 6, 7]
    recorded = json.loads((run_dir / "skip_batches.json").read_text())
    assert recorded["batches"] == [7] and recorded["spikes"][0]["step"] == 7
    first_records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][:7]
    assert first_records[6]["spike"] == 1 and first_records[6]["step"] == 7  # logged before stopping
    # the restart: from checkpoint step-4 (the last one; nothing was saved after the spike), batch 7 never trained
    assert result["resumed_at"] == 4
    assert result["second_batches"] == [5, 6, 8, 9, 10, 11, 12, 13]
    assert [r["step"] for r in result["history"]] == list(range(5, 13))
    assert not any(r.get("spike") for r in result["history"])
    assert "global batch 7 skipped: recorded in" in result["console"]
    # steps 5 and 6 replay the first run's bit for bit
    assert [r["loss"] for r in result["history"][:2]] == [r["loss"] for r in first_records[4:6]]


# -- warmup-stable-decay ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, at_quarter, at_half",
    [
        ("linear", 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.5),
        ("cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), 0.1 + 0.9 * 0.5),
        ("sqrt", 0.1 + 0.9 * (1 - 0.5), 0.1 + 0.9 * (1 - math.sqrt(0.5))),
    ],
)
def test_wsd_formula(shape, at_quarter, at_half):
    warmup, total, decay = 100, 1000, 200  # stable from step 100 to 800, decay over 800..1000
    assert wsd_factor(1, warmup, total, decay, 0.1, shape) == pytest.approx(0.01)
    assert wsd_factor(50, warmup, total, decay, 0.1, shape) == pytest.approx(0.5)
    assert wsd_factor(100, warmup, total, decay, 0.1, shape) == 1.0
    assert wsd_factor(500, warmup, total, decay, 0.1, shape) == 1.0
    assert wsd_factor(800, warmup, total, decay, 0.1, shape) == pytest.approx(1.0)
    assert wsd_factor(850, warmup, total, decay, 0.1, shape) == pytest.approx(at_quarter)
    assert wsd_factor(900, warmup, total, decay, 0.1, shape) == pytest.approx(at_half)
    assert wsd_factor(1000, warmup, total, decay, 0.1, shape) == pytest.approx(0.1)
    assert wsd_factor(1200, warmup, total, decay, 0.1, shape) == pytest.approx(0.1)


def schedule_lrs(overrides: list[str], updates: int, tokens_per_step: int = 1) -> list[float]:
    """The lr of update 1..``updates`` from build_scheduler under ``overrides`` (peak 1.0)."""
    cfg = load_config(None, ["train.optimizer.lr=1.0", *overrides])
    optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg.train.optimizer)
    scheduler = build_scheduler(optimizer, cfg.train.schedule, tokens_per_step)
    lrs = []
    for _ in range(updates):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_build_scheduler_cosine_unchanged_and_wsd_defaults():
    cosine = schedule_lrs(["train.schedule.warmup_steps=10", "train.schedule.total_steps=100"], 120)
    assert cosine == [lr_factor(n, 10, 100, 0.1) for n in range(1, 121)]
    # wsd's defaults: decay over the last 0.2 of total_steps, 1 - sqrt shape
    wsd = schedule_lrs(
        ["train.schedule.kind=wsd", "train.schedule.warmup_steps=10", "train.schedule.total_steps=100"], 100
    )
    assert wsd == [wsd_factor(n, 10, 100, 20, 0.1, "sqrt") for n in range(1, 101)]
    assert wsd[79] == 1.0 and wsd[89] == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)))
    # decay_steps beats decay_fraction; token counts resolve as for cosine (2 sequences of 2 tokens per step)
    tokens = [
        "train.schedule.kind=wsd",
        "train.schedule.warmup_tokens=40",
        "train.schedule.total_tokens=400",
        "train.schedule.decay_steps=30",
        "train.schedule.decay_shape=linear",
        "train.global_batch_size=2",
        "train.micro_batch_size=2",
        "data.seq_len=2",
    ]
    assert schedule_lrs(tokens, 100, tokens_per_step=4) == [
        wsd_factor(n, 10, 100, 30, 0.1, "linear") for n in range(1, 101)
    ]


def test_a_resumed_scheduler_follows_its_own_total_steps_from_the_first_step():
    """The optimizer's saved lr belongs to the schedule it was saved under; apply_schedule replaces it."""

    def build(total: int):
        cfg = load_config(
            None,
            [
                "train.schedule.kind=wsd",
                "train.schedule.warmup_steps=2",
                f"train.schedule.total_steps={total}",
                "train.schedule.decay_fraction=0.5",
            ],
        )
        optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg.train.optimizer)
        return optimizer, build_scheduler(optimizer, cfg.train.schedule, 1)

    optimizer, scheduler = build(12)
    for _ in range(8):  # cut mid-decay: update 9 would use wsd_factor(9, 2, 12, 6)
        optimizer.step()
        scheduler.step()
    saved = optimizer.state_dict(), scheduler.state_dict()
    optimizer, scheduler = build(20)  # extended: the decay now starts after step 10
    optimizer.load_state_dict(saved[0])
    scheduler.load_state_dict(saved[1])
    peak = 3e-4
    assert optimizer.param_groups[0]["lr"] == pytest.approx(peak * wsd_factor(9, 2, 12, 6, 0.1, "sqrt"))
    apply_schedule(scheduler)
    assert optimizer.param_groups[0]["lr"] == scheduler.get_last_lr()[0] == peak * wsd_factor(9, 2, 20, 10, 0.1, "sqrt")


def _wsd_lrs(run_dir: str, plans: list[dict]) -> list[list[tuple[int, float, float]]]:
    """Run the trainer once per plan in ``run_dir`` (each resuming the last); (step, lr, loss) per step of each."""
    from ladder_train.parallel import init_distributed

    env = init_distributed()
    runs = []
    for plan in plans:
        settings = {
            "train.spike.enabled": False,
            "train.schedule.kind": "wsd",
            "train.schedule.decay_fraction": 0.5,
            "train.schedule.decay_shape": "linear",
            **plan,
        }
        trainer = spiky_trainer(env, run_dir, set(), [], **settings)
        runs.append([(r["step"], r["lr"], r["loss"]) for r in trainer.train()])
    dist.destroy_process_group()
    return runs


@pytest.mark.slow
def test_wsd_cut_mid_decay_and_resumed_equals_one_run_and_an_extension_decays_later(tmp_path):
    whole = {"train.schedule.total_steps": 12, "train.max_steps": 12}
    cut = {"train.schedule.total_steps": 12, "train.max_steps": 8}
    extended = {"train.schedule.total_steps": 20, "train.max_steps": 20}
    (one,) = run_ranks(_wsd_lrs, 1, str(tmp_path / "one"), [whole])[0]
    first, rest = run_ranks(_wsd_lrs, 1, str(tmp_path / "cut"), [cut, whole])[0]
    peak = 3e-3
    assert [lr for _, lr, _ in one] == pytest.approx(
        [peak * wsd_factor(n, 2, 12, 6, 0.1, "linear") for n in range(1, 13)]
    )
    assert [s for s, _, _ in first] == list(range(1, 9)) and [s for s, _, _ in rest] == list(range(9, 13))
    assert first + rest == one  # the same lr sequence, and the same losses
    # a run extended mid-decay (total 12 -> 20 at step 8): its decay now starts after step 10 and ends at 20
    _, longer = run_ranks(_wsd_lrs, 1, str(tmp_path / "ext"), [cut, extended])[0]
    assert [s for s, _, _ in longer] == list(range(9, 21))
    assert [lr for _, lr, _ in longer] == [peak * wsd_factor(n, 2, 20, 10, 0.1, "linear") for n in range(9, 21)]
    # peak through step 10, then a tenth of the way down per step: step 19 at 0.1 + 0.9 / 10, step 20 at the floor
    assert longer[1][1] == peak and longer[-2][1] == pytest.approx(peak * (0.1 + 0.9 / 10))
    assert longer[-1][1] == pytest.approx(peak * 0.1)


# -- config refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.schedule.kind=step", "train.schedule.kind"),
        ("train.schedule.decay_shape=exp", "train.schedule.decay_shape"),
        ("train.spike.action=panic", "train.spike.action"),
        ("train.spike.window=-5", "train.spike.window"),
        ("train.spike.window=1", "train.spike.window"),
        ("train.spike.threshold=0", "train.spike.threshold"),
        ("train.spike.threshold=-2", "train.spike.threshold"),
        ("train.spike.watch=[accuracy]", "train.spike.watch"),
        ("train.spike.watch=[]", "train.spike.watch"),
        ("train.schedule.decay_fraction=0", "train.schedule.decay_fraction"),
        ("train.schedule.decay_fraction=1.5", "train.schedule.decay_fraction"),
        ("train.schedule.decay_steps=0", "train.schedule.decay_steps"),
        ("train.schedule.decay_steps=24000", "train.schedule.decay_steps"),  # 2000 warmup + 24000 > 25000
        ("train.schedule.decay_fraction=0.95", "train.schedule.decay_fraction"),  # 23750 + 2000 > 25000
    ],
)
def test_bad_stability_and_schedule_values_are_refused_naming_the_key(override, key):
    extra = ["train.schedule.kind=wsd"] if "decay" in override else []
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*extra, override])
    message = str(caught.value)
    assert f"key '{key}'" in message and "\n" not in message


def test_a_decay_that_fits_exactly_and_selective_checkpointing_are_valid():
    cfg = load_config(
        None,
        [
            "train.schedule.kind=wsd",
            "train.schedule.decay_steps=23000",
            "train.spike.action=stop",
            "parallel.activation_checkpoint=selective",
        ],
    )
    assert cfg.train.schedule.decay_steps + cfg.train.schedule.warmup_steps == cfg.train.schedule.total_steps
