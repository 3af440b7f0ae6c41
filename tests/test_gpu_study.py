"""benchmarks/gpu_study.py: a study's runs several at once on one machine (the GPU's way of running the small
layout study), checked on the CPU: what each point is given, the budget, and what is collected."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks import gpu_study

REPO = Path(__file__).resolve().parents[1]
RECIPE = str(REPO / "recipes/study_small.yaml")


def text_folder(root: Path) -> Path:
    """Made-up documents in a train and a validation split (jsonl), read with the recipe's byte tokenizer."""
    words = "the court held that a state law on appeal was void because federal rules apply here".split()
    root.mkdir()
    for split, count in (("train", 200), ("validation", 20)):
        with open(root / f"{split}.jsonl", "w") as f:
            for i in range(count):
                f.write(json.dumps({"text": " ".join(words[(i * 7 + j) % len(words)] for j in range(120))}) + "\n")
    return root


def test_a_machine_without_shared_reads_the_carried_copies(tmp_path, monkeypatch):
    copies = {"../shared/data/fineweb": tmp_path / "fineweb", "../shared/eval": tmp_path / "eval"}
    for folder in copies.values():
        folder.mkdir()
    monkeypatch.setattr(gpu_study, "SHARED_COPIES", copies)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")  # no ../shared beside it
    assert gpu_study.machine_overrides(RECIPE, tiny=False, given=[]) == [
        "wandb.mode=disabled",
        "train.dtype=bf16",
        f"data.source={tmp_path / 'fineweb'}",
        f"eval.local_data={tmp_path / 'eval'}",
    ]
    given = ["data.source=/elsewhere"]  # a --set wins: not replaced
    assert gpu_study.machine_overrides(RECIPE, tiny=True, given=given) == [
        "wandb.mode=disabled",
        f"eval.local_data={tmp_path / 'eval'}",
    ]
    (tmp_path / "eval").rmdir()
    with pytest.raises(SystemExit, match=r"reads \.\./shared/eval \(eval.local_data\), absent here"):
        gpu_study.machine_overrides(RECIPE, tiny=True, given=[])


VICTIM = b"someone's file\n"


@pytest.mark.parametrize("planted", ["before", "during the runs"])
def test_a_link_at_the_summary_is_refused_in_one_line_and_its_target_is_untouched(tmp_path, monkeypatch, planted):
    victim, out = tmp_path / "victim", tmp_path / "out"
    victim.write_bytes(VICTIM)
    out.mkdir()
    summary = out / "gpu_study.json"
    run = []  # what main got to: the studies read, the runs started
    monkeypatch.setattr(gpu_study, "ensure_imports", lambda: None)
    monkeypatch.setattr(gpu_study, "studies", lambda args, work: run.append("studies") or [])
    monkeypatch.setattr(gpu_study, "environment", lambda *args, **kwargs: {})

    def runs(*args, **kwargs):
        run.append("runs")
        if planted == "during the runs":
            summary.symlink_to(victim)

    monkeypatch.setattr(gpu_study, "run_parts", runs)
    if planted == "before":
        summary.symlink_to(victim)  # ln -s ~/victim OUT/gpu_study.json
    with pytest.raises(SystemExit) as refused:
        gpu_study.main(["--tiny", "--out", str(out), "--study", RECIPE])
    assert str(refused.value) == (
        f"gpu_study: error: {summary} is a symbolic link; a file of this project is never written through a link: "
        "remove it"
    )
    assert victim.read_bytes() == VICTIM and summary.is_symlink()
    if planted == "before":  # refused before any run, and before logs/ is made
        assert run == [] and [p.name for p in out.iterdir()] == ["gpu_study.json"]
    else:
        assert run == ["studies", "runs"] and sorted(p.name for p in out.iterdir()) == ["gpu_study.json", "logs"]


@pytest.mark.slow
def test_a_bad_study_is_one_line_before_any_run(tmp_path):
    argv = [sys.executable, "-m", "benchmarks.gpu_study", "--tiny", "--out", str(tmp_path / "out")]
    argv += ["--study", f"{RECIPE} model.residual=standard,nonsense run.dir=runs/x"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("gpu_study: error: ")
    assert "nonsense" in done.stderr


@pytest.mark.slow
def test_runs_within_the_budget_and_collects_the_finished_ones(tmp_path):
    tokens = text_folder(tmp_path / "docs")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "benchmarks.gpu_study", "--tiny", "--out", str(out), "--jobs", "1"]
    argv += ["--budget-s", "5", "--study", f"{RECIPE} model.residual=ladder run.seed=0,1 run.dir=runs/pairs"]
    argv += ["--study", f"{RECIPE} model.residual=standard run.seed=0,1 run.dir=runs/pairs"]  # interleaved: not run
    for item in ("train.max_steps=2", "train.schedule.warmup_steps=1", "train.schedule.total_steps=2"):
        argv += ["--set", item]
    for item in ("eval.val_every=2", "eval.val_batches=1", "eval.at_end=false", "checkpoint.every=0"):
        argv += ["--set", item]
    argv += ["--set", f"data.source={tokens}", "--set", "data.num_workers=0"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]  # one point left out: not all finished
    summary = json.loads((out / "gpu_study.json").read_text())
    first, *others = summary["runs"]  # in the order they were started: the two studies' points interleaved
    assert [r["run"].split("/")[1] for r in others] == [
        "model.residual=standard,run.seed=0",
        "model.residual=ladder,run.seed=1",
        "model.residual=standard,run.seed=1",
    ]
    assert first["run"] == "pairs/model.residual=ladder,run.seed=0" and first["finished"] and first["outcome"] == "done"
    for second in others:
        assert second["outcome"] == "not started (budget)" and not second["finished"] and second["wall_s"] == 0
    run = out / "pairs" / "model.residual=ladder,run.seed=0"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "summary.json"]
    assert not (out / "pairs" / "model.residual=ladder,run.seed=1").exists()
    vals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "val_loss" in x]
    assert vals[-1]["step"] == 2 and first["final_val_loss"] == vals[-1]["val_loss"]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["model"]["residual"], config["run"]["seed"], config["train"]["max_steps"]) == ("ladder", 0, 2)
    assert config["data"]["source"] == str(tokens) and config["train"]["dtype"] == "fp32"  # --tiny: no bf16
    assert summary["env"]["command"].startswith("python -m benchmarks.gpu_study --tiny")
    assert (out / "logs" / "model.residual=ladder,run.seed=0.log").is_file()
