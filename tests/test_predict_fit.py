"""ladder-predict on a card's rows: the fit of the hand-set constants (recovered from rows the model itself made; the
committed H100 and H200 rows give the errors docs/benchmarks.md shows), and --compare on gpu_check's decode rows."""

import json
from pathlib import Path

import pytest

from ladder_train.cli import ladder_predict as predict_main
from ladder_train.errors import InputError
from ladder_train.predict import compare, fit, rows
from ladder_train.predict.hardware import load_profiles
from ladder_train.predict.perfmodel import predict_generation
from ladder_train.predict.shapes import resolve_shape

GPU = Path(__file__).resolve().parent.parent / "docs" / "results" / "gpu"
H100 = [GPU / "h100_2026-11-27.jsonl", GPU / "h100_2026-11-26_bench_tp1_8layers.jsonl"]
H200 = [GPU / "h200_2026-11-28.jsonl"]


def decode_row(n_layers: int, tpot_ms: float, prefill_ms: float, device: str = "NVIDIA H100 80GB HBM3") -> dict:
    """A row as gpu_check's decode_row (benchmarks/gpu_rows.py) writes it: the keys ladder-predict reads, and more."""
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


def test_the_fit_recovers_the_constants_that_made_the_rows(tmp_path):
    """Rows made by the model itself at known constants: fitting all three recovers them; fitting two, the third
    taken from the ceilings row's copy rate, recovers those two."""
    true = {"compute_eff": 0.42, "mem_eff": 0.55, "kernel_us": 3.3}
    devices = load_profiles()
    h100 = devices["h100"]
    made = []
    for n_layers in (8, 40):
        p = predict_generation(
            resolve_shape("1.2B", overrides={"n_layers": n_layers}),
            fit.with_values(h100, true),
            h100.links["nvlink"],
            1,
            "standard",
            1,
            512,
            256,
        )
        made.append(decode_row(n_layers, p["decode_ms_per_token"], p["prefill_ms"]))
    ceilings = {"kind": "ceilings", "copy_tb_s_median": true["mem_eff"] * h100.mem_bw / 1e12, "error": None}
    card = fit.load_card([write_rows(tmp_path / "made.jsonl", [*made, ceilings])], devices)
    assert (card.profile, card.points, card.copy_eff) == ("h100", 4, pytest.approx(0.55))
    assert fit.fit(card, fit.CONSTANTS) == pytest.approx(true, rel=1e-4)
    assert fit.fit(card) == pytest.approx(true, rel=1e-4)  # compute_eff and kernel_us; mem_eff from the copy rate
    assert fit.point_errors(fit.predicted(card, true)) == pytest.approx([0.0] * 4, abs=1e-12)
    with pytest.raises(InputError, match="2 point"):  # one row: 2 points for 3 constants
        fit.fit(fit.load_card([write_rows(tmp_path / "one.jsonl", made[:1])], devices), fit.CONSTANTS)


def by_row(record: dict) -> dict:
    return {(p["row"].split(" (")[0], p["sample"]): p for p in record["predictions"]}


def test_the_committed_card_rows_give_the_documented_errors():
    """docs/benchmarks.md's table "fitted on one card, checked on the other": the H100's 4 points and the H200's 2."""
    result = fit.card_check(H100, H200, load_profiles())
    assert {name: (c["rows"], c["points"]) for name, c in result["cards"].items()} == {"h100": (2, 4), "h200": (1, 2)}
    shipped = {p["row"].split(" (")[0]: p for p in result["shipped"]}
    assert shipped["h100, 40 layers"]["TPOT"]["error"] == pytest.approx(-0.151, abs=5e-4)  # the issue's -15 %
    assert shipped["h100, 40 layers"]["prefill"]["error"] == pytest.approx(-0.310, abs=5e-4)  # and -31 %
    devices = load_profiles()
    by_compare = compare.compare_with_bench(compare.bench_rows(H100[0]), devices["h100"])[0][0]
    assert by_compare["pred_decode_ms"] == pytest.approx(shipped["h100, 40 layers"]["TPOT"]["predicted_ms"], rel=1e-12)
    assert by_compare["pred_prefill_ms"] == pytest.approx(
        shipped["h100, 40 layers"]["prefill"]["predicted_ms"], rel=1e-12
    )
    h100_two, h200_two, h100_three, h200_three = result["fits"]
    # compute_eff and kernel_us, mem_eff each card's copy rate over its datasheet bandwidth
    assert h100_two["fitted"] == pytest.approx({"compute_eff": 0.340, "mem_eff": 0.8966, "kernel_us": 2.831}, abs=1e-3)
    h200 = by_row(h100_two)["h200, 40 layers, GEMV tuning", "out"]
    assert h200["values"]["mem_eff"] == pytest.approx(0.8851, abs=1e-4)  # the H200's own
    assert (h200["TPOT"]["error"], h200["prefill"]["error"]) == pytest.approx((0.306, 0.045), abs=5e-4)
    assert h100_two["mean_abs_error"] == pytest.approx({"in": 0.084, "out": 0.176}, abs=5e-4)
    # the reverse: 2 points, 2 constants: zero in sample by construction
    assert h200_two["fitted"] == pytest.approx({"compute_eff": 0.313, "mem_eff": 0.8851, "kernel_us": 1.945}, abs=1e-3)
    assert h200_two["mean_abs_error"]["in"] == pytest.approx(0.0, abs=1e-9)
    out = by_row(h200_two)
    assert [out["h100, 40 layers", "out"][q]["error"] for q in ("TPOT", "prefill")] == pytest.approx(
        [-0.204, 0.081], abs=5e-4
    )
    assert [out["h100, 8 layers", "out"][q]["error"] for q in ("TPOT", "prefill")] == pytest.approx(
        [-0.207, -0.222], abs=5e-4
    )
    # all three on the H100: kernel_us at its bound 0; the H200 cannot fit three
    assert h100_three["fitted"] == pytest.approx({"compute_eff": 0.290, "mem_eff": 0.306, "kernel_us": 0.0}, abs=1e-3)
    h200 = by_row(h100_three)["h200, 40 layers, GEMV tuning", "out"]
    assert (h200["TPOT"]["error"], h200["prefill"]["error"]) == pytest.approx((-0.049, -0.037), abs=5e-4)
    assert h200_three["error"] == "2 points cannot fit 3 constants"
    assert "in-sample error zero by construction" in fit.note(result)


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


def test_fit_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "fit.json"
    argv = ["fit", *map(str, H100), "--check", str(H200[0]), "--free", "compute_eff,kernel_us", "--out", str(out)]
    assert predict_main(argv) == 0
    printed = capsys.readouterr().out
    assert "| h100, 40 layers (h100_2026-11-27.jsonl) | in | 0.340 | 0.897 | 2.83 |" in printed
    assert [f["fitted_on"] for f in json.loads(out.read_text())["fits"]] == ["h100", "h200"]
    assert predict_main(["fit", str(H100[0]), "--check", str(H200[0]), "--free", "speed"]) == 2
    assert "free constants must be some of compute_eff, mem_eff, kernel_us" in capsys.readouterr().err
