"""Two trainer settings as a user meets them: the whole ``ladder-train`` command from launch to exit, variant a and b
alternating, each round in a fresh run folder.

    python -m benchmarks.launch_ab --a KEY=VALUE [--a ...] --b KEY=VALUE [--b ...] [--rounds 3]
                                   [--config recipes/smoke.yaml] [--out FILE.jsonl] [key=value ...]

train_ab.py times the steady steps inside one process; this times what they leave out: the imports of every process
the run starts (a loader worker's server imports torch and datasets again), the model's build, the final checkpoint.
A round's figures: its wall seconds, and the machine's busy CPU seconds over the same interval (/proc/stat: every
core and every process, also one the trainer started and did not wait for; so the machine must be otherwise quiet).
A pair's b / a ratio is taken within the pair. A round whose command fails stops the benchmark (exit 1).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.records import BenchmarkError, append_rows, config_override, invocation, positive_int, refuse
from ladder_train.lifetime import ends_with_this_process


def busy_cpu_s() -> float:
    """The machine's CPU seconds spent outside idle and I/O wait since boot, over all cores (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def one_round(config: str, overrides: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "ladder_train.train", "--config", config, f"run.dir={run_dir}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    busy, start = busy_cpu_s(), time.perf_counter()
    # the trainer gets SIGTERM (saves, exits) if the benchmark dies: no round outlives it
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=ends_with_this_process())
    wall, cpu = time.perf_counter() - start, busy_cpu_s() - busy
    if done.returncode != 0:
        raise BenchmarkError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return {"wall_s": wall, "busy_cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", action="append", type=config_override, required=True, metavar="KEY=VALUE")
    parser.add_argument("--b", action="append", type=config_override, required=True, metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=positive_int, default=3, help="alternating pairs of rounds")
    parser.add_argument("--config", default="recipes/smoke.yaml")
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per round")
    parser.add_argument("overrides", nargs="*", type=config_override, help="for both variants")
    args = parser.parse_args(argv)
    if not Path("/proc/stat").is_file():
        refuse("launch_ab", "needs Linux /proc/stat for the machine's CPU time")
    if not Path(args.config).is_file():
        refuse("launch_ab", f"--config {args.config}: no such file")
    record = invocation("benchmarks.launch_ab", argv)
    variants = {"a": args.a, "b": args.b}
    rows = []
    with tempfile.TemporaryDirectory(prefix="launch_ab_") as work:
        for pair in range(args.rounds):
            for name, settings in variants.items():
                figures = one_round(args.config, [*args.overrides, *settings], Path(work) / f"{name}{pair}")
                row = {"variant": name, "round": pair, "variants": variants, "config": args.config}
                rows.append({**row, "overrides": args.overrides, **figures, **record})
                print(f"round {pair} {name}: {figures['wall_s']:.1f} s wall, {figures['busy_cpu_s']:.1f} CPU s")
    append_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchmarkError as err:
        print(f"launch_ab: error: {err}", file=sys.stderr)
        sys.exit(1)
