"""tools/docs_tables/gpu_tables.py: the GPU tables of docs/benchmarks.md from gpu_check's rows, on hand-made rows."""

import json

from tools.docs_tables import gpu_tables as gpu
from tools.docs_tables.manifest import read_rows

ENV = {
    "card": "NVIDIA H100 80GB HBM3",
    "driver": "580.1",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "date": "2026-11-27",
    "invocation": "a",
    "command": "python -m benchmarks.gpu_check --out X",
}


def train_row(layout, micro, tps, mfu, peak, plan, **extra):
    return {
        "kind": "train",
        "layout": layout,
        "recipe": f"recipes/{layout}_1b.yaml",
        "micro_batch": micro,
        "compiled": True,
        "measured_steps": [6, 14],
        "tokens_per_s_median": tps,
        "tokens_per_s_min": tps - 1000,
        "tokens_per_s_max": tps + 500,
        "mfu_median": mfu,
        "peak_mem_gib": peak,
        "plan_total_gib": plan,
        "plan_rel_error": (plan - peak) / peak,
        "plan_accumulation": "unsharded",
        "error": None,
        "env": ENV,
        **extra,
    }


def write(tmp_path, rows):
    """The rows as a builder gets them from the file the manifest names: (its JSON lines, its path)."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_rows(path), "rows.jsonl"


def test_training_table_rows_and_plan_error(tmp_path):
    rows = [
        train_row("standard", 2, 33801.6, 0.2992, 30.0, 29.7),
        train_row("ladder", 1, 9246.0, 0.218, 70.0, 70.7, recipe="recipes/ladder_3b.yaml", kind="big", compiled=False),
        train_row("parallel", 2, 1.0, 0.1, 1.0, 1.0, error="FAILED (exit 1): boom"),  # a failed part is left out
        train_row("standard", 2, 40000.0, 0.354, 30.0, 29.7, variant=["parallel.blocks_per_fsdp_unit=4"]),
    ]
    text = gpu.training(*write(tmp_path, rows))
    lines = text.splitlines()
    assert lines[2] == (
        "| 1.2B | standard | 2 | unsharded | compiled | 6–14 | 33,802 (32,802–34,302) | 29.9 % | 30.00 | 29.70 | -1.0 % |"
    )
    assert (
        lines[3]
        == "| 3.5B | ladder | 1 | unsharded | eager | 6–14 | 9,246 (8,246–9,746) | 21.8 % | 70.00 | 70.70 | +1.0 % |"
    )
    assert lines[4].startswith(
        "| 1.2B | standard | 2 | unsharded | compiled, `parallel.blocks_per_fsdp_unit=4` | 6–14 | 40,000 "
    )
    assert len([x for x in lines if x.startswith("| ")]) == 5  # header + 3 rows: the failed part is not a row
    assert "1 invocation(s): `python -m benchmarks.gpu_check --out X`" in text and text.endswith(".\n")


def test_decode_share_of_the_copy_rate_and_profile(tmp_path):
    decode = {
        "kind": "decode",
        "model": "1.2B",
        "layout": "standard",
        "n_layers": 40,
        "batch": 1,
        "prompt_len": 512,
        "gen_len": 256,
        "gemv_tuning": True,
        "tpot_ms": 2.0,
        "tpot_sd_ms": 0.01,
        "weight_bytes": 2.4e9,
        "bandwidth_gb_s": 1200.0,
        "error": None,
        "env": ENV,
    }
    ceilings = {
        "kind": "ceilings",
        "copy": {"repeats": 50, "bytes_read_plus_written": 2**31},
        "copy_tb_s_median": 3.0,
        "matmul": {"repeats": 30, "n": 8192},
        "matmul_tflops_median": 796.2,
    }
    profile = {
        "kind": "profile",
        "layout": "standard",
        "micro_batch": 8,
        "steps_traced": 3,
        "busy_share": 0.883,
        "host_step_ms": 638.2,
        "kernels_per_step": 4895.0,
        "copies_per_step": 454.0,
        "memsets_per_step": 1468.0,
        "runtime_calls_per_step": 8633.3,
        "error": None,
        "env": ENV,
    }
    written = write(tmp_path, [decode, ceilings, profile])
    text = gpu.decoding(*written)
    assert "| 1.2B | standard | on | 40 | 1 | 512 + 256 | 2.000 ± 0.010 | 2,400 | 1,200 | 40 % of 3,000 |" in text
    assert "a 1 GiB device-to-device copy" in text and "796 TFLOP/s (median of 30)" in text
    assert "| standard | 8 | 3 | 88.3 % | 638 | 4,895 | 454 | 1,468 | 8,633 |" in gpu.profiled(*written)


def test_peers_beside_ours(tmp_path):
    figures = {"tokens_per_s_median": 25000.0, "tokens_per_s_min": 24000.0, "tokens_per_s_max": 25500.0}
    titan = {"kind": "peer_train", "micro_batch": 2, "peer_version": "0.2.2", "precision": "autocast", **figures}
    titan.update(mfu_median=0.2213, ours_tokens_per_s=30000.0, ours_over_theirs=1.2, error=None, env=ENV)
    bare = {"kind": "bare_loop", "micro_batch": 8, "accumulate": "unsharded", **figures, "mfu_median": None}
    bare.update(ours_tokens_per_s=24000.0, trainer_over_bare=0.96, error=None, env=ENV)
    decode = {"kind": "peer_decode", "peer_version": "5.17.0", "compiled": True, "tpot_ms": 2.4, "n_layers": 40}
    decode.update(prompt_len=512, gen_len=256, ours_tpot_ms=1.8, ours_gemv_tuning=False, ours_over_theirs=0.75)
    failed = {**titan, "micro_batch": 8, "error": "TIMED OUT"}
    text = gpu.peers(*write(tmp_path, [titan, bare, {**decode, "error": None, "env": ENV}, failed]))
    lines = text.splitlines()
    assert lines[2] == (
        "| training | torchtitan 0.2.2 (autocast) | 2 | 25,000 (24,000–25,500) tokens/s | 22.1 % | 30,000 | 1.200 |"
    )
    assert lines[3] == (
        "| training | our model, bare loop (unsharded) | 8 | 25,000 (24,000–25,500) tokens/s | - | 24,000 | 0.960 |"
    )
    assert lines[4] == (
        "| decode | transformers 5.17.0 (static cache, compiled) | batch 1 | TPOT 2.400 ms (40 layers, 512 + 256) | - "
        "| TPOT 1.800 ms, GEMV untuned | 0.750 |"
    )
    assert len([x for x in lines if x.startswith("| ")]) == 5  # header + 3 rows: the timed-out part is not a row


def test_the_readme_quotes_the_h200_training_rows_as_committed():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    rows = read_rows(root / "docs/results/gpu/h200_2026-11-28.jsonl")
    plain = [r for r in rows if r["kind"] == "train" and not r.get("variant") and not r.get("error")]
    recipe = [r for r in plain if r["micro_batch"] == 8]
    assert sorted(r["layout"] for r in recipe) == ["ladder", "parallel", "standard"]
    mfu = sorted(100 * r["mfu_median"] for r in recipe)
    tokens = sorted(r["tokens_per_s_median"] / 1000 for r in recipe)
    plan = max(abs(100 * r["plan_rel_error"]) for r in plain)  # micro-batches 2 and 8, the removed settings' rows not
    quoted = (
        f"trained at {mfu[0]:.1f}-{mfu[-1]:.1f} % MFU ({tokens[0]:.1f}k-{tokens[-1]:.1f}k tokens/s, medians) at their"
        f" recipes' micro-batch 8, the memory plan within {plan:.1f} % of every peak (2026-11-28, one run per row"
    )
    assert quoted in " ".join((root / "README.md").read_text().split())
