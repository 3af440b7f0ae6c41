"""``ladder-predict validate --out-dir DIR``: check the predictor against ladder-bench on this CPU, in one
command: calibrate the ``cpu`` profile, run ladder-bench (TP = 2, gloo) on three shapes with the real gloo
link and two emulated latencies X each, then print predicted against measured (``--compare``).

The three shapes span the regimes that decide what overlap can do: small latency-bound modules (batch 1,
hidden 2304), larger memory-bound ones (batch 1, hidden 4096) and compute-bound ones (batch 64, hidden 3072);
for each, one X below its modules' decode compute and one above. ``--layouts`` as ladder-bench's (``desync-K``
too). Run it on a quiet machine (it takes ~10 minutes on 2 cores, with the three layouts): timings taken while
other jobs share the cores are distorted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..errors import InputError, RunFailed
from ..files import remove_written, write_text
from ..lifetime import ends_with_this_process
from ..model import PAPER_LAYOUTS
from ..option_errors import OptionError, check_layouts

PROG = "ladder-predict validate"

# name -> (ladder-bench --set fields, batch, prompt, gen, (X below, X above the module time) in ms)
CASES = {
    "h2304-b1": ("n_layers=8 dim=2304 n_heads=32 n_kv_heads=32 ffn_dim=9216 vocab_size=512", 1, 32, 16, (2, 12)),
    "h4096-b1": ("n_layers=4 dim=4096 n_heads=32 n_kv_heads=32 ffn_dim=5504 vocab_size=512", 1, 32, 16, (6, 20)),
    "h3072-b64": ("n_layers=4 dim=3072 n_heads=32 n_kv_heads=32 ffn_dim=4096 vocab_size=512", 64, 4, 8, (20, 90)),
}


def bench_command(
    fields: str, batch: int, prompt: int, gen: int, x_ms: float, runs: int, out: Path, layouts=PAPER_LAYOUTS
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "ladder_train.bench",
        "--model",
        "tiny",
        "--set",
        *fields.split(),
        "max_seq_len=64",
    ]
    command += ["--tp", "2", "--batch-sizes", str(batch), "--prompt-len", str(prompt), "--gen-len", str(gen)]
    command += ["--runs", str(runs), "--warmup", "1", "--compile", "off", "--link-latency-ms", str(x_ms)]
    command += ["--layouts", ",".join(layouts)]
    return [*command, "--out", str(out)]


def validate(
    out_dir: str,
    runs: int = 3,
    cases: list[str] | None = None,
    *,
    calibrate_now: bool = True,
    bench_now: bool = True,
    layouts=PAPER_LAYOUTS,
) -> None:
    """Calibrate into OUT_DIR/cpu.yaml, run ladder-bench into OUT_DIR/bench.jsonl, compare into compare.txt;
    ``calibrate_now`` / ``bench_now`` False reuse the file of an earlier run."""
    cases = list(CASES) if cases is None else cases
    bad = [c for c in cases if c not in CASES]
    if bad or not cases or runs < 1:
        raise OptionError("{cases} must name some of {known} and {runs} be >= 1", known=", ".join(CASES))
    check_layouts(layouts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    profile, bench = out / "cpu.yaml", out / "bench.jsonl"
    for now, path in ((calibrate_now, profile), (bench_now, bench)):
        if not now and not path.is_file():
            raise InputError(f"{path} does not exist (asked to reuse it)")
    if calibrate_now:
        from .calibrate import calibrate

        calibrate(str(profile))
    if bench_now:
        remove_written(bench)  # ladder-bench appends: start from this run's rows only
    for name in cases if bench_now else []:
        fields, batch, prompt, gen, xs = CASES[name]
        for x in (0, *xs):
            print(f"\n{PROG}: {name}, X = {x} ms", flush=True)
            command = bench_command(fields, batch, prompt, gen, x, runs, bench, layouts)
            subprocess.run(command, check=True, preexec_fn=ends_with_this_process())
    compare = [sys.executable, "-m", "ladder_train.predict", "--compare", str(bench), "--profile", str(profile)]
    result = subprocess.run(compare, capture_output=True, text=True, preexec_fn=ends_with_this_process())
    if result.returncode:
        raise RunFailed(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "compare failed")
    write_text(out / "compare.txt", result.stdout)
    print(result.stdout)
    print(f"{PROG}: wrote {profile}, {bench} and {out / 'compare.txt'}")
