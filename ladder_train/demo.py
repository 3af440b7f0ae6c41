"""``ladder-train demo`` (``make demo``): the whole mission in miniature, on one CPU machine, offline.

1. trains the three layouts (standard, parallel, ladder) of the smoke model on the same tokens;
2. evaluates each with lm-eval on local ARC-Easy and PIQA copies when ``../shared/eval`` exists
   (otherwise says so and keeps the held-out validation loss only);
3. runs the tensor-parallel benchmark at TP = 2 on the CPU with an emulated slow link;
4. writes ``runs/demo/report/report.md`` with the table and plots.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .model.transformer import RESIDUAL_LAYOUTS

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env: dict) -> None:
    print(f"\n$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, env=env, check=True)


def find_shared_eval() -> Path | None:
    """The local eval sets beside the checkout (../shared/eval), if this machine has them."""
    candidate = Path(os.environ.get("LADDER_SHARED", REPO.parent / "shared")) / "eval"
    return candidate if (candidate / "arc_easy.jsonl").is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ladder-train demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    parser.add_argument("--steps", type=int, default=300, help="training steps per layout")
    parser.add_argument(
        "--link-latency-ms", type=float, default=1.0, help="the emulated all-reduce latency of the TP benchmark"
    )
    args = parser.parse_args(argv)
    python = sys.executable
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    env.setdefault("WANDB_MODE", "offline")
    started = time.time()
    shared_eval = find_shared_eval()
    if shared_eval is None:
        print("demo: ../shared/eval not found: skipping the lm-eval step (validation loss only)", flush=True)

    runs = []
    for layout in RESIDUAL_LAYOUTS:
        run_dir = args.out / layout
        if run_dir.exists():  # a fresh demo each time, not an auto-resume of the last one
            shutil.rmtree(run_dir)
        cmd = [python, "-m", "ladder_train.train", "--config", str(REPO / "recipes" / "smoke.yaml")]
        cmd += [
            f"run.name=demo_{layout}",
            f"run.dir={run_dir}",
            f"model.residual={layout}",
            f"train.max_steps={args.steps}",
        ]
        cmd += [
            f"train.schedule.total_steps={args.steps}",
            "eval.val_every=50",
            "eval.val_batches=8",
            "checkpoint.keep=1",
        ]
        if shared_eval is not None:
            cmd += [
                "eval.at_end=true",
                "eval.tasks=[arc_easy_local,piqa_local]",
                f"eval.local_data={shared_eval}",
                "eval.limit=100",
            ]
        _run(cmd, env)
        runs.append(run_dir)

    bench = args.out / "bench.jsonl"
    bench.unlink(missing_ok=True)
    # a model wide enough that one module's decode step takes milliseconds on the CPU
    cmd = [
        python,
        "-m",
        "ladder_train.inference.bench",
        "--model",
        "tiny",
        "--tp",
        "2",
        "--layouts",
        ",".join(RESIDUAL_LAYOUTS),
    ]
    cmd += ["--set", "dim=1024", "n_layers=4", "n_heads=8", "ffn_dim=2816", "vocab_size=4096", "max_seq_len=512"]
    cmd += ["--batch-sizes", "1,4", "--prompt-len", "64", "--gen-len", "16", "--runs", "2"]
    cmd += ["--link-latency-ms", str(args.link_latency_ms), "--out", str(bench)]
    _run(cmd, env)

    cmd = [
        python,
        "-m",
        "ladder_train.report",
        *map(str, runs),
        "--bench",
        str(bench),
        "--out",
        str(args.out / "report"),
    ]
    _run(cmd, env)
    print(f"\ndemo finished in {(time.time() - started) / 60:.1f} min: open {args.out / 'report' / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
