"""Seeing inside a run (``profile.*``, ``tensorboard.*``): each rank of a 2-rank training writes one chrome trace of
the scheduled steps; on CUDA the allocator's history is dumped at the chosen step and when an OutOfMemoryError
stops the run (the calls recorded, no GPU here); TensorBoard holds the scalars metrics.jsonl holds; bad values are
one-line config errors."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from tiny import tiny_run_config

from ladder_train.config import ConfigError, ProfileConfig, load_config
from ladder_train.train import observability
from ladder_train.train.observability import MEMORY_HISTORY_ENTRIES, StepProfiler

REPO = Path(__file__).resolve().parents[1]
SEQ, VOCAB = 16, 64


def tiny_config(run_dir: str, steps: int, **extra):
    return tiny_run_config(
        run_dir,
        VOCAB,
        SEQ,
        **{"train.global_batch_size": 4, "train.micro_batch_size": 2, "train.max_steps": steps, **extra},
    )


def random_batches(rank: int):
    generator = torch.Generator().manual_seed(rank)
    while True:
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


# -- the config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("profile.active=0", "key 'profile.active' must be at least 1, got 0"),
        ("profile.wait=-1", "key 'profile.wait' must be >= 0, got -1"),
        ("profile.warmup=-2", "key 'profile.warmup' must be >= 0, got -2"),
        ("profile.repeat=-1", "key 'profile.repeat' must be >= 0 (0 = until the run ends), got -1"),
        (
            "profile.memory_snapshot_step=-3",
            "key 'profile.memory_snapshot_step' must be >= 0 (0 = only at an OutOfMemoryError), or null for no "
            "recording, got -3",
        ),
        ("tensorboard.enabled=sometimes", "key 'tensorboard.enabled' expects bool, got 'sometimes'"),
    ],
)
def test_bad_profile_and_tensorboard_values_are_one_line_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_misspelt_profile_key_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown key 'profile.activ' \(did you mean 'active'\?\)"):
        load_config(None, ["profile.activ=3"])


def test_by_default_nothing_is_profiled_and_the_schedule_traces_within_ten_steps():
    cfg = load_config(None, [])
    assert cfg.profile.enabled is False and cfg.tensorboard.enabled is False
    assert cfg.profile.memory_snapshot_step is None
    assert cfg.profile.wait + cfg.profile.warmup + cfg.profile.active <= 10 and cfg.profile.repeat == 1


# -- traces -------------------------------------------------------------------------------------------------


def trace_names(path: Path) -> Counter:
    return Counter(event.get("name") for event in json.loads(path.read_text())["traceEvents"])


def _train_profiled(run_dir: str) -> list[str]:
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    profile = {"profile.enabled": True, "profile.wait": 1, "profile.warmup": 1, "profile.active": 2}
    cfg = tiny_config(run_dir, 5, **profile)
    try:
        trainer = Trainer(cfg, env, batches=random_batches(env.rank))
        trainer.train()
    finally:
        dist.destroy_process_group()
    return sorted(p.name for p in (Path(run_dir) / "profile").iterdir())


@pytest.mark.slow
def test_two_rank_training_writes_one_trace_per_rank_of_the_active_steps(tmp_path):
    listings = run_ranks(_train_profiled, 2, str(tmp_path / "run"))
    # steps 1 wait, 2 warm up, 3-4 traced, 5 after the one cycle: the profiler counts from 0, so #2 and #3
    assert listings[0] == listings[1] == ["rank0_steps3-4.pt.trace.json", "rank1_steps3-4.pt.trace.json"]
    for rank in (0, 1):
        path = tmp_path / "run" / "profile" / f"rank{rank}_steps3-4.pt.trace.json"
        trace = json.loads(path.read_text())
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["world_size"] == 2
        names = trace_names(path)
        assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3"]
        assert names["ProfilerStep#2"] == names["ProfilerStep#3"] == 1
        # two steps of 15 matmuls (7 projections in each of the 2 layers, the head), each once forward and twice
        # backward; and FSDP's collectives on gloo
        assert names["aten::mm"] == 2 * 15 * 3
        assert names["c10d::_allgather_base_"] > 0 and names["c10d::_reduce_scatter_base_"] > 0
        assert names["gloo:all_reduce"] > 0  # the step's loss / preemption all-reduce


def test_a_trace_cut_short_by_the_end_of_the_run_keeps_the_steps_it_has(tmp_path):
    cfg = ProfileConfig(enabled=True, wait=0, warmup=1, active=3)
    profiler = StepProfiler(cfg, tmp_path, rank=0, device=torch.device("cpu"))
    x = torch.randn(8, 8)
    for step in (1, 2, 3):  # 1 is the warm-up; 2 and 3 are traced; the run ends before 4
        x = x @ x.T / 8
        profiler.step(step)
    profiler.close()
    assert profiler.traces == [tmp_path / "profile" / "rank0_steps2-3.pt.trace.json"]
    names = trace_names(profiler.traces[0])
    assert names["ProfilerStep#1"] == names["ProfilerStep#2"] == 1 and names["aten::mm"] >= 1


def test_a_run_shorter_than_the_schedule_writes_no_trace_and_says_so(tmp_path, capsys):
    profiler = StepProfiler(ProfileConfig(enabled=True), tmp_path, rank=0, device=torch.device("cpu"))
    for step in (1, 2, 3):
        profiler.step(step)
    profiler.close()
    assert profiler.traces == [] and list((tmp_path / "profile").iterdir()) == []
    assert (
        "no trace written: the run ended after 3 steps of this process, before the traced ones (from its step 8)"
        in (capsys.readouterr().out)
    )


def test_nothing_enabled_leaves_no_profile_folder(tmp_path):
    profiler = StepProfiler(ProfileConfig(), tmp_path, rank=0, device=torch.device("cpu"))
    profiler.step(1)
    profiler.out_of_memory(1)
    profiler.close()
    assert not (tmp_path / "profile").exists()


# -- CUDA memory snapshots, with the allocator's functions recorded -----------------------------------------


class MemoryRecorder:
    """Stands in for torch.cuda.memory's history functions, which need a GPU."""

    def __init__(self, monkeypatch):
        self.history: list[dict] = []
        self.dumps: list[str] = []
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: self.history.append(kw))
        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda filename: self.dumps.append(filename))


def test_memory_history_is_dumped_at_the_step_and_at_out_of_memory_on_cuda(tmp_path, monkeypatch):
    recorder = MemoryRecorder(monkeypatch)
    cfg = ProfileConfig(memory_snapshot_step=2)
    profiler = StepProfiler(cfg, tmp_path, rank=1, device=torch.device("cuda"))
    assert recorder.history == [{"max_entries": MEMORY_HISTORY_ENTRIES}] and recorder.dumps == []
    profiler.step(1)
    assert recorder.dumps == []
    profiler.step(2)
    assert recorder.dumps == [str(tmp_path / "profile" / "rank1_memory_step2.pickle")]
    profiler.step(3)
    profiler.out_of_memory(3)
    assert recorder.dumps[1:] == [str(tmp_path / "profile" / "rank1_memory_oom_after_step3.pickle")]
    profiler.close()
    profiler.close()  # the trainer's finally may follow an earlier close: stops recording once
    assert recorder.history[1:] == [{"enabled": None}]


def test_snapshot_step_zero_dumps_only_at_out_of_memory(tmp_path, monkeypatch):
    recorder = MemoryRecorder(monkeypatch)
    profiler = StepProfiler(ProfileConfig(memory_snapshot_step=0), tmp_path, rank=0, device=torch.device("cuda"))
    for step in (1, 2, 3):
        profiler.step(step)
    assert recorder.dumps == []
    profiler.out_of_memory(3)
    profiler.close()
    assert recorder.dumps == [str(tmp_path / "profile" / "rank0_memory_oom_after_step3.pickle")]


def test_memory_snapshots_record_nothing_on_the_cpu(tmp_path, monkeypatch):
    recorder = MemoryRecorder(monkeypatch)
    profiler = StepProfiler(ProfileConfig(memory_snapshot_step=1), tmp_path, rank=0, device=torch.device("cpu"))
    profiler.step(1)
    profiler.out_of_memory(1)
    profiler.close()
    assert recorder.history == [] and recorder.dumps == []


def _train_until_out_of_memory(run_dir: str):
    """A trainer on 'CUDA' (the device check and the allocator's history functions stood in for) whose third
    forward runs out of memory."""
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    calls = []
    torch.cuda.memory._record_memory_history = lambda **kw: calls.append(("record", kw))
    torch.cuda.memory._dump_snapshot = lambda filename: calls.append(("dump", filename))
    on_cpu = observability.StepProfiler.__init__
    observability.StepProfiler.__init__ = lambda self, cfg, run_dir, rank, device: on_cpu(
        self, cfg, run_dir, rank, torch.device("cuda")
    )
    env = init_distributed()
    trainer = Trainer(tiny_config(run_dir, 5, **{"profile.memory_snapshot_step": 1}), env, batches=random_batches(0))
    forward = trainer.model.forward

    def out_of_memory_at_step_3(ids, labels=None):
        if trainer.step == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(ids, labels=labels)

    trainer.model.forward = out_of_memory_at_step_3
    try:
        trainer.train()
        outcome = "finished"
    except torch.OutOfMemoryError as err:
        outcome = f"{type(err).__name__}: {err}"
    finally:
        dist.destroy_process_group()
    return outcome, trainer.step, calls


@pytest.mark.slow
def test_the_trainer_dumps_the_memory_history_when_out_of_memory_stops_it(tmp_path):
    outcome, step, calls = run_ranks(_train_until_out_of_memory, 1, str(tmp_path))[0]
    assert outcome == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"  # re-raised unchanged
    assert step == 2
    assert calls == [
        ("record", {"max_entries": MEMORY_HISTORY_ENTRIES}),
        ("dump", str(tmp_path / "profile" / "rank0_memory_step1.pickle")),
        ("dump", str(tmp_path / "profile" / "rank0_memory_oom_after_step2.pickle")),
        ("record", {"enabled": None}),
    ]


# -- TensorBoard ----------------------------------------------------------------------------------------------


def _smoke_run_with_tensorboard(run_dir: str) -> int:
    import ladder_train.evaluation as evaluation
    from ladder_train.cli import main

    def fake_evaluate(model, tokenizer, tasks, out_path=None, **kwargs):  # lm-eval's part is not under test
        return {"fake_task": {"acc": 0.625, "acc_norm": 0.5}}

    evaluation.evaluate = fake_evaluate
    argv = [
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={run_dir}",
        "train.max_steps=6",
        "train.log_every=2",
        "data.num_workers=0",
        "eval.val_every=3",
        "eval.val_batches=2",
        "eval.at_end=true",
        "eval.tasks=[fake_task]",
        "wandb.mode=disabled",
        "tensorboard.enabled=true",
    ]
    return main(argv)


@pytest.mark.slow
def test_tensorboard_holds_the_scalars_of_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    assert run_ranks(_smoke_run_with_tensorboard, 2, str(run_dir)) == [0, 0]
    event_files = list((run_dir / "tensorboard").iterdir())
    assert len(event_files) == 1 and event_files[0].name.startswith("events.out.tfevents.")  # rank 0 only
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected_steps = {
        "loss": [2, 4, 6],
        "lr": [2, 4, 6],
        "grad_norm": [2, 4, 6],
        "tokens_per_s": [2, 4, 6],
        "val_loss": [3, 6],
        "eval/fake_task/acc": [6],
        "eval/fake_task/acc_norm": [6],
    }
    for tag, steps in expected_steps.items():
        logged = [(r["step"], np.float32(r[tag])) for r in records if tag in r]
        assert [step for step, _ in logged] == steps, tag
        assert [(s.step, np.float32(s.value)) for s in events.Scalars(tag)] == logged, tag  # float32 scalars
    assert events.Scalars("eval/fake_task/acc")[0].value == 0.625
    assert "mfu" not in events.Tags()["scalars"]  # null on the CPU: not logged, as on wandb


def test_a_resumed_run_replaces_the_tensorboard_points_after_its_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ladder_train.train.observability import MetricLogger

    cfg = load_config(None, ["tensorboard.enabled=true", "wandb.mode=disabled"])
    first = MetricLogger(cfg, tmp_path, is_main=True)
    for step in range(1, 7):  # preempted after step 6, with the last checkpoint at step 4
        first.log({"step": step, "loss": 10.0 - step}, console=False)
    first.close()
    again = MetricLogger(cfg, tmp_path, is_main=True, resumed_step=4)
    for step in (5, 6):
        again.log({"step": step, "loss": 0.5}, console=False)
    again.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("loss")] == [(1, 9), (2, 8), (3, 7), (4, 6), (5, 0.5), (6, 0.5)]


def test_other_ranks_write_no_tensorboard_files(tmp_path):
    from ladder_train.train.observability import MetricLogger

    cfg = load_config(None, ["tensorboard.enabled=true", "wandb.mode=disabled"])
    logger = MetricLogger(cfg, tmp_path, is_main=False)
    logger.log({"step": 1, "loss": 1.0})
    logger.close()
    assert not (tmp_path / "tensorboard").exists() and logger.tensorboard is None
