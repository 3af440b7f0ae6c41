"""`make demo`'s job end to end, shortened: three layouts trained, benchmarked at TP 2, and reported."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_trains_benchmarks_and_reports_the_three_layouts(tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "ladder_train.cli", "demo", "--out", str(out), "--steps", "20"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"open {out / 'report' / 'report.md'}" in done.stdout
    for layout in ("standard", "parallel", "ladder"):
        assert json.loads((out / layout / "summary.json").read_text())["step"] == 20
    rows = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines()]
    assert sorted({(r["layout"], r["batch"]) for r in rows}) == sorted(
        (layout, batch) for layout in ("standard", "parallel", "ladder") for batch in (1, 4)
    )
    assert all(r["tokens_per_s"] > 0 and r["gen_len"] == 16 for r in rows)
    report = (out / "report" / "report.md").read_text()
    assert "| validation loss (final) |" in report and "## Tensor-parallel generation" in report
    assert "| demo_standard | demo_parallel | demo_ladder |" in report
