"""``ladder-train demo`` (``make demo``): the whole mission in miniature, on one CPU machine, offline.

1. trains the three layouts (standard, parallel, ladder) of the smoke model on the same tokens;
2. evaluates each with lm-eval on local ARC-Easy and PIQA copies when ``../shared/eval`` exists
   (otherwise says so and keeps the held-out validation loss only);
3. runs the tensor-parallel benchmark at TP = 2 on the CPU with an emulated slow link;
4. writes ``runs/demo/report/report.md`` with the table and plots.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .files import remove_written, remove_written_tree
from .lifetime import ends_with_this_process
from .model import PAPER_LAYOUTS
from .report import write_report

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env: dict) -> None:
    print(f"\n$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, env=env, check=True, preexec_fn=ends_with_this_process())


def find_shared_eval() -> Path | None:
    """The local eval sets beside the checkout (../shared/eval), if this machine has them."""
    candidate = Path(os.environ.get("LADDER_SHARED", REPO.parent / "shared")) / "eval"
    return candidate if (candidate / "arc_easy.jsonl").is_file() else None


def run_demo(out: Path, steps: int, link_latency_ms: float) -> Path:
    """Train, evaluate and benchmark the three layouts into ``out``; returns the report's path."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    env.setdefault("WANDB_MODE", "offline")
    shared_eval = find_shared_eval()
    if shared_eval is None:
        print("demo: ../shared/eval not found: skipping the lm-eval step (validation loss only)", flush=True)
    runs = [_train_layout(layout, out / layout, steps, shared_eval, env) for layout in PAPER_LAYOUTS]
    bench = out / "bench.jsonl"
    remove_written(bench)
    _benchmark(bench, link_latency_ms, env)
    return write_report(runs, out / "report", [bench])


def _train_layout(layout: str, run_dir: Path, steps: int, shared_eval: Path | None, env: dict) -> Path:
    if run_dir.exists():  # a fresh demo each time, not an auto-resume of the last one
        remove_written_tree(run_dir)
    cmd = [sys.executable, "-m", "ladder_train.train", "--config", str(REPO / "recipes" / "smoke.yaml")]
    cmd += [f"run.name=demo_{layout}", f"run.dir={run_dir}", f"model.residual={layout}", f"train.max_steps={steps}"]
    cmd += [f"train.schedule.total_steps={steps}", "eval.val_every=50", "eval.val_batches=8", "checkpoint.keep=1"]
    if shared_eval is not None:
        cmd += ["eval.at_end=true", "eval.tasks=[arc_easy_local,piqa_local]", f"eval.local_data={shared_eval}"]
        cmd += ["eval.limit=100"]
    _run(cmd, env)
    return run_dir


def _benchmark(out: Path, link_latency_ms: float, env: dict) -> None:
    """TP = 2 on the CPU, a model wide enough that one module's decode step takes milliseconds."""
    cmd = [sys.executable, "-m", "ladder_train.bench", "--model", "tiny", "--tp", "2", "--layouts"]
    cmd += [",".join(PAPER_LAYOUTS)]
    cmd += ["--set", "dim=1024", "n_layers=4", "n_heads=8", "ffn_dim=2816", "vocab_size=4096", "max_seq_len=512"]
    cmd += ["--batch-sizes", "1,4", "--prompt-len", "64", "--gen-len", "16", "--runs", "2"]
    cmd += ["--link-latency-ms", str(link_latency_ms), "--out", str(out)]
    _run(cmd, env)
