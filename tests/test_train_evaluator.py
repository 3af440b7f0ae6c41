"""The evaluator (ladder_train/train/evaluator.py): which steps validate and run lm-eval, the smoke run's evaluation
at its end, and ranks that wait for a slow rank-0 eval beyond the collective timeout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_utils import run_ranks
from test_train import tiny_config

REPO = Path(__file__).resolve().parents[1]


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
