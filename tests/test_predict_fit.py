"""ladder-predict on a card's rows: --compare on gpu_check's decode rows."""

import json
from pathlib import Path

import pytest

from ladder_train.cli import ladder_predict as predict_main
from ladder_train.errors import InputError
from ladder_train.predict import compare, rows
from ladder_train.predict.hardware import load_profiles
from ladder_train.predict.perfmodel import predict_generation
from ladder_train.predict.shapes import resolve_shape

GPU = Path(__file__).resolve().parent.parent / "docs" / "results" / "gpu"
H100 = [GPU / "h100_2026-11-27.jsonl", GPU / "h100_2026-11-26_bench_tp1_8layers.jsonl"]
H200 = [GPU / "h200_2026-11-28.jsonl"]


def decode_row(n_layers: int, tpot_ms: float, prefill_ms: float, device: str = "NVIDIA H100 80GB HBM3") -> dict:
    """A row as benchmarks/gpu_check.py's decode_row writes it (the keys ladder-predict reads, and a few more)."""
    return {
        "kind": "decode",
        "layout": "standard",
        "model": "1.2B",
        "n_layers": n_layers,
        "batch": 1,
        "compiled": True,
        "gemv_tuning": False,
        "dtype": "bfloat16",
        "prompt_len": 512,
        "gen_len": 256,
        "tpot_ms": tpot_ms,
        "prefill_ms": prefill_ms,
        "tokens_per_s": 1.0,
        "device": device,
        "error": None,
    }


def write_rows(path: Path, rows_: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    return path


def test_compare_reads_a_gpu_check_decode_row_on_its_cards_profile(tmp_path, capsys):
    path = write_rows(tmp_path / "check.jsonl", [{"kind": "train", "layout": "standard"}, decode_row(40, 2.5, 5.0)])
    (row,) = compare.bench_rows(path)
    assert (row["decode_ms_per_token"], row["prefill_ms"], row["tp"]) == (2.5, 5.0, 1)
    assert row["model_args"]["n_layers"] == 40 and row["shape"] == "1.2B:n_layers=40"
    devices = load_profiles()
    assert rows.profile_for(row, devices) == "h100"
    assert rows.profile_for({**row, "device": "NVIDIA H200"}, devices) == "h200"
    assert rows.profile_for({**row, "device": "cpu (2 cores)"}, devices) == "cpu"
    with pytest.raises(InputError, match="no profile has card h100_nvl"):
        rows.profile_for({**row, "device": "NVIDIA H100 NVL"}, devices)
    (result,), summary = compare.compare_with_bench([row], devices["h100"])
    p = predict_generation(
        resolve_shape("1.2B", overrides={"n_layers": 40}), devices["h100"], devices["h100"].links["nvlink"], 1,
        "standard", 1, 512, 256,
    )  # fmt: skip
    assert result["pred_decode_ms"] == pytest.approx(p["decode_ms_per_token"])
    assert result["decode_err"] == pytest.approx(p["decode_ms_per_token"] / 2.5 - 1)
    assert result["prefill_err"] == pytest.approx(p["prefill_ms"] / 5.0 - 1) and summary["prefill"] > 0
    assert predict_main(["--compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert "PREDICTED (h100 profile) vs MEASURED" in out and "   2.500" in out and "   5.000" in out
    only_train = write_rows(tmp_path / "train.jsonl", [{"kind": "train"}])
    assert predict_main(["--compare", str(only_train)]) == 2
    assert "no rows to predict" in capsys.readouterr().err
