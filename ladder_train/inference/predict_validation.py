"""``ladder-predict validate --out-dir DIR``: check the predictor against ladder-bench on this CPU, in one
command: calibrate the ``cpu`` profile, run ladder-bench (TP = 2, gloo) on three shapes with the real gloo
link and two emulated latencies X each, then print predicted against measured (``--compare``).

The three shapes span the regimes that decide what overlap can do: small latency-bound modules (batch 1,
hidden 2304), larger memory-bound ones (batch 1, hidden 4096) and compute-bound ones (batch 64, hidden 3072);
for each, one X below its modules' decode compute and one above. Run it on a quiet machine (it takes
~15 minutes on 2 cores): timings taken while other jobs share the cores are distorted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ..errors import InputError, RunFailed

PROG = "ladder-predict validate"

# name -> (ladder-bench --set fields, batch, prompt, gen, (X below, X above the module time) in ms)
CASES = {
    "h2304-b1": ("n_layers=8 dim=2304 n_heads=32 n_kv_heads=32 ffn_dim=9216 vocab_size=512", 1, 32, 16, (2, 12)),
    "h4096-b1": ("n_layers=4 dim=4096 n_heads=32 n_kv_heads=32 ffn_dim=5504 vocab_size=512", 1, 32, 16, (6, 20)),
    "h3072-b64": ("n_layers=4 dim=3072 n_heads=32 n_kv_heads=32 ffn_dim=4096 vocab_size=512", 64, 4, 8, (20, 90)),
}


def bench_command(fields: str, batch: int, prompt: int, gen: int, x_ms: float, runs: int, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "ladder_train.inference.bench", "--model", "tiny", "--set", *fields.split(),
        "max_seq_len=64", "--tp", "2", "--batch-sizes", str(batch), "--prompt-len", str(prompt), "--gen-len",
        str(gen), "--runs", str(runs), "--warmup", "1", "--compile", "off", "--link-latency-ms", str(x_ms),
        "--out", str(out),
    ]  # fmt: skip


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True, help="writes cpu.yaml, bench.jsonl and compare.txt here")
    p.add_argument("--runs", type=int, default=3, help="ladder-bench measured runs per case (medians)")
    p.add_argument("--cases", default=",".join(CASES), help=f"a subset of {', '.join(CASES)}")
    p.add_argument("--skip-calibrate", action="store_true", help="reuse OUT_DIR/cpu.yaml")
    p.add_argument("--skip-bench", action="store_true", help="reuse OUT_DIR/bench.jsonl (compare only)")
    opts = p.parse_args(argv)
    cases = [c for c in opts.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases or opts.runs < 1:
        raise InputError(f"--cases must name some of {', '.join(CASES)} and --runs be >= 1")
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    profile, bench = out / "cpu.yaml", out / "bench.jsonl"
    for skip, path in ((opts.skip_calibrate, profile), (opts.skip_bench, bench)):
        if skip and not path.is_file():
            raise InputError(f"{path} does not exist (asked to reuse it)")
    if not opts.skip_calibrate:
        from .calibrate import run as calibrate

        calibrate(["--out", str(profile)])
    if not opts.skip_bench:
        bench.unlink(missing_ok=True)  # ladder-bench appends: start from this run's rows only
    for name in cases if not opts.skip_bench else []:
        fields, batch, prompt, gen, xs = CASES[name]
        for x in (0, *xs):
            print(f"\n{PROG}: {name}, X = {x} ms", flush=True)
            subprocess.run(bench_command(fields, batch, prompt, gen, x, opts.runs, bench), check=True)
    result = subprocess.run(
        [sys.executable, "-m", "ladder_train.inference.predict", "--compare", str(bench), "--profile", str(profile)],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode:
        raise RunFailed(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "compare failed")
    (out / "compare.txt").write_text(result.stdout)
    print(result.stdout)
    print(f"{PROG}: wrote {profile}, {bench} and {out / 'compare.txt'}")
    return 0
