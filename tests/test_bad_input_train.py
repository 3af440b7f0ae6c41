"""Bad input to a training run that only shows once it runs or resumes: a hand-edited skip file, a trainer entry
whose counters were rewritten, a schedule that ended before the checkpoint's step, a disk that fills while a
checkpoint is written, paths the file system refuses. Each is one line, before any step where it can be."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest
import torch
from cli_errors import VICTIM, assert_bad_input, run_cli, someones_folder, untouched

from ladder_train.checkpoint import Checkpointer, CheckpointError
from ladder_train.checkpoint.safe_load import check_trainer_counters
from ladder_train.config import load_config
from ladder_train.errors import InputError
from ladder_train.model import ModelArgs, Transformer

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")
QUICK = ["data.num_workers=0", "wandb.mode=disabled", "eval.at_end=false"]


@pytest.mark.parametrize(
    "text, named",
    [
        ('{"batches": ["2"]}', "key 'batches' must be a list of global batch numbers >= 1, got [\"2\"]"),
        ('{"batches": [1, 2', "not valid JSON"),
        ("{}", 'expected {"batches": [global batch numbers >= 1], "spikes": [...]}, got {}'),
        ("[1, 2]", "got [1, 2]"),
        ('{"batches": 2}', "key 'batches' must be a list of global batch numbers >= 1, got 2"),
        ('{"batches": [0]}', "got [0]"),
        ('{"batches": [true]}', "got [true]"),
    ],
)
def test_a_hand_edited_skip_file_is_refused_in_one_line(tmp_path, capsys, monkeypatch, text, named):
    run = tmp_path / "run"
    run.mkdir()
    (run / "skip_batches.json").write_text(text)
    argv = ["--config", SMOKE, f"run.dir={run}", "train.max_steps=1", *QUICK]
    assert_bad_input("ladder-train", argv, (f"{run / 'skip_batches.json'}: ", named), capsys, monkeypatch)
    assert not (run / "checkpoints").exists()  # refused before any step


def test_trainer_entry_counters_must_be_whole_numbers_and_match_the_folder(tmp_path):
    folder = tmp_path / "checkpoints" / "step-2"
    check_trainer_counters(folder, {"step": 2, "tokens_seen": 64, "world_size": 1})
    check_trainer_counters(tmp_path / "copied", {"step": 7})  # a folder without a step number: any step >= 0
    bad = {
        "the trainer entry's step is -7": {"step": -7},
        "the trainer entry's step is 1000000000000000, but the folder is step-2": {"step": 10**15},
        "the trainer entry's tokens_seen is 1.5": {"step": 2, "tokens_seen": 1.5},
        "the trainer entry's world_size is 0": {"step": 2, "world_size": 0},
        "the trainer entry's step is True": {"step": True},
        "the trainer entry is a list": [2],
    }
    for message, entry in bad.items():
        with pytest.raises(CheckpointError, match="previous complete checkpoint") as refused:
            check_trainer_counters(folder, entry)
        assert message in str(refused.value)


def test_a_checkpoint_whose_step_was_rewritten_is_refused_by_export(tmp_path, capsys, monkeypatch):
    checkpointer, model, optimizer = _tiny_checkpointer(tmp_path / "run")
    written = checkpointer.save(3, model, optimizer, {"step": 3, "model_args": dataclasses.asdict(model.args)}, {})
    renamed = written.with_name("step-5")  # the folder says 5, the entry 3
    written.rename(renamed)
    status, _, err = run_cli("ladder-export", [str(renamed), str(tmp_path / "out")], capsys, monkeypatch)
    assert status == 1, err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith("the trainer entry's step is 3, but the folder is step-5; the previous complete checkpoint is none")
    )


def _argv(run: Path) -> list[str]:
    return ["--config", SMOKE, f"run.dir={run}", *QUICK, "train.schedule.kind=wsd", "train.schedule.warmup_steps=1"]


def _tiny_checkpointer(folder: Path):
    cfg = load_config(None, ["checkpoint.async_save=false"])
    model = Transformer(ModelArgs(vocab_size=64, dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_seq_len=16))
    return Checkpointer(cfg.checkpoint, folder, rank=0, world_size=1), model, torch.optim.AdamW(model.parameters())


def test_a_checkpoint_write_that_fills_the_disk_says_so_and_names_what_survives(tmp_path, monkeypatch):
    import ladder_train.checkpoint.checkpointer as checkpointer_module

    checkpointer, model, optimizer = _tiny_checkpointer(tmp_path)
    kept = checkpointer.save(1, model, optimizer, {"step": 1}, {})

    def full_disk(*args, **kwargs):
        raise RuntimeError("unexpected pos 704 vs 598")  # what torch's writer says when a write came up short

    monkeypatch.setattr(checkpointer_module.dcp, "save", full_disk)
    monkeypatch.setattr(checkpointer_module.shutil, "disk_usage", lambda path: _Usage(free=3 * 2**20))
    with pytest.raises(CheckpointError) as refused:
        checkpointer.save(2, model, optimizer, {"step": 2}, {})
    assert str(refused.value) == (
        f"writing {tmp_path / 'checkpoints' / 'step-2.partial'} failed (RuntimeError: unexpected pos 704 vs 598), the "
        f"partial checkpoint is removed: 3 MiB free on its file system; free space, then rerun to resume from {kept}"
    )
    assert not (tmp_path / "checkpoints" / "step-2.partial").exists()
    # with space to spare the failure is not about the disk: it keeps its own type and traceback
    monkeypatch.setattr(checkpointer_module.shutil, "disk_usage", lambda path: _Usage(free=50 * 2**30))
    with pytest.raises(RuntimeError, match="unexpected pos"):
        checkpointer.save(2, model, optimizer, {"step": 2}, {})
    monkeypatch.setattr(checkpointer_module.dcp, "save", _raise(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(CheckpointError, match=r"failed \(OSError: \[Errno 28\] No space left on device \(ENOSPC\)\)"):
        checkpointer.save(2, model, optimizer, {"step": 2}, {})


class _Usage:
    def __init__(self, free: int):
        self.total, self.used, self.free = 2 * free, free, free


def _raise(err: Exception):
    def fail(*args, **kwargs):
        raise err

    return fail


def test_run_folders_the_file_system_refuses_are_one_line(tmp_path, capsys, monkeypatch):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    long_name = tmp_path / ("a" * 300)
    for run_dir, named in [(loop / "run", "symbolic link points back into itself"), (long_name, "shorter")]:
        argv = ["--config", SMOKE, f"run.dir={run_dir}", "train.max_steps=1", *QUICK]
        assert_bad_input("ladder-train", argv, named, capsys, monkeypatch)
    assert [p.name for p in tmp_path.iterdir()] == ["loop"]


# -- nothing written through a link planted in the run folder ---------------------------------------------------


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    return victim


@pytest.mark.parametrize(
    "name",
    ["run.lock", "config.yaml", "metrics.jsonl", "summary.json", "summary.json.partial", "skip_batches.json", "wandb"]
    + ["tensorboard"],
)
def test_a_link_planted_in_the_run_folder_is_refused_in_one_line_and_its_target_is_untouched(
    tmp_path, capsys, monkeypatch, name
):
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(victim)  # ln -s ~/victim RUN/config.yaml, then train into RUN
    argv = ["--config", SMOKE, f"run.dir={run}", "train.max_steps=1", *QUICK]
    named = f"ladder-train: error: {run / name} is a symbolic link; "
    assert_bad_input("ladder-train", argv, named, capsys, monkeypatch)
    assert victim.read_bytes() == VICTIM
    assert [p.name for p in run.iterdir()] == [name] and (run / name).is_symlink()  # refused before any work


@pytest.mark.parametrize("name", ["export", "export/step-2"])
def test_a_link_where_eval_mode_slurm_exports_is_refused_in_one_line_before_any_step(
    tmp_path, capsys, monkeypatch, name
):
    elsewhere = someones_folder(tmp_path)
    run = tmp_path / "run"
    (run / name).parent.mkdir(parents=True)
    (run / name).symlink_to(elsewhere)  # RUN_DIR/export/step-N: the export of checkpoint step-N, for its eval job
    argv = ["--config", SMOKE, f"run.dir={run}", "train.max_steps=2", "checkpoint.every=2", "eval.mode=slurm", *QUICK]
    named = f"ladder-train: error: {run / name} is a symbolic link; "
    assert_bad_input("ladder-train", argv, named, capsys, monkeypatch)
    assert untouched(elsewhere)
    assert not (run / "checkpoints").exists() and not (run / "config.yaml").exists()  # refused before any work


def test_a_link_at_the_runs_eval_folder_is_refused_in_one_line_before_any_step(tmp_path, capsys, monkeypatch):
    elsewhere = someones_folder(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval").symlink_to(elsewhere)  # RUN_DIR/eval/step-N.json: the lm-eval results the trainer writes
    argv = ["--config", SMOKE, f"run.dir={run}", "train.max_steps=2", *QUICK]
    named = f"ladder-train: error: {run / 'eval'} is a symbolic link; a run's eval folder is never written through"
    assert_bad_input("ladder-train", argv, named, capsys, monkeypatch)
    assert untouched(elsewhere)
    assert not (run / "checkpoints").exists() and not (run / "config.yaml").exists()  # refused before any work


def test_an_export_refuses_a_link_planted_in_the_run_folder_while_it_ran(tmp_path):
    from ladder_train.parallel import RankEnv
    from ladder_train.train.evaluator import Evaluator

    checkpointer, model, optimizer = _tiny_checkpointer(tmp_path / "run")
    checkpoint = checkpointer.save(2, model, optimizer, {"step": 2, "model_args": dataclasses.asdict(model.args)}, {})
    cfg = load_config(None, ["eval.mode=slurm"])
    env = RankEnv(0, 1, 0, 1, torch.device("cpu"))
    evaluator = Evaluator(cfg, env, tmp_path / "run", model.args, micro_batch=1, tokenizer=None)
    elsewhere = someones_folder(tmp_path)
    for name in ("export", "export/step-2"):
        link = tmp_path / "run" / name
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(elsewhere)
        with pytest.raises(InputError) as refused:
            evaluator._submit_eval_job(checkpoint, 2, tmp_path / "run" / "eval" / "step-2.json")
        assert str(refused.value) == (
            f"{link} is a symbolic link; a folder of this project is never written through a link: remove it"
        )
        assert untouched(elsewhere)
        link.unlink()


def test_a_link_planted_in_the_checkpoint_folder_is_refused_and_nothing_behind_it_is_touched(tmp_path):
    checkpointer, model, optimizer = _tiny_checkpointer(tmp_path / "run")
    victim, elsewhere = _victim(tmp_path), someones_folder(tmp_path)
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("step-1.partial", "step-2"):  # the folder being written, and the one it is renamed to
        (folder / name).symlink_to(elsewhere)
        with pytest.raises(InputError, match=f"^{folder / name} is a symbolic link; "):
            checkpointer.save(int(name[5]), model, optimizer, {"step": 1}, {})
        (folder / name).unlink()
    assert untouched(elsewhere)
    (folder / "step-3.partial").mkdir()  # a killed save's folder, with a link planted in it: removed as an entry
    (folder / "step-3.partial" / "COMPLETE").symlink_to(victim)
    saved = checkpointer.save(3, model, optimizer, {"step": 3}, {})
    assert (saved / "COMPLETE").read_text() == "step 3\n" and not (saved / "COMPLETE").is_symlink()
    assert victim.read_bytes() == VICTIM
