"""docs/benchmarks.md's generated tables of ladder-predict's predictions (tools/docs_tables/predict_tables.py):
the renderers on hand-made rows, the doc's blocks equal to what the committed rows give, and the committed rows equal
to what the predictor gives as the code stands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import predictor_sensitivity
from ladder_train.predict.predictions import PredictOptions, prediction_rows
from tools.docs_tables import MANIFEST, TABLES, make_table, predict_tables

ROOT = Path(__file__).resolve().parents[1]
LLAMA70B_TP8, SENSITIVITY_FILE = (MANIFEST[name].rows for name in ("predict-llama70b-tp8", "predict-sensitivity"))
NAMES = ("predict-llama70b-tp8", "predict-sensitivity")


def _grid_row(link: str, layout: str, prefill: float, decode: float, speedup: float, decode_sp: float) -> dict:
    return {
        "model": "llama-70b",
        "gpu": "h100",
        "link": link,
        "tp": 8,
        "batch": 4,
        "layout": layout,
        "prompt_len": 1024,
        "gen_len": 512,
        "prefill_ms": prefill,
        "decode_ms_per_token": decode,
        "tokens_per_s": 100.0,
        "speedup_vs_standard": speedup,
        "decode_speedup_vs_standard": decode_sp,
        "comm_share": 0.25 if link == "nvlink" else 0.5,
        "prediction": True,
    }


GRID = [
    _grid_row("nvlink", "standard", 186.6, 14.628, 1.0, 1.0),
    _grid_row("nvlink", "parallel", 155.6, 12.919, 1.1344, 1.132),
    _grid_row("nvlink", "ladder", 139.6, 11.926, 1.2291, 1.2266),
    _grid_row("nvlink", "none", 132.8, 11.5384, 1.2709, 1.268),
    _grid_row("pcie", "standard", 922.2, 20.0, 1.0, 1.0),
    _grid_row("pcie", "parallel", 523.3, 16.0, 1.3, 1.25),
    _grid_row("pcie", "ladder", 790.6, 12.5, 1.45, 1.6),
    _grid_row("pcie", "none", 132.8, 10.0, 1.7385, 2.0),
]


def test_the_prediction_grid_shows_each_link_and_batch_from_its_four_layouts():
    assert predict_tables.prediction_grid(GRID, "x.jsonl") == (
        "| link | batch | standard prefill ms | standard decode ms/tok | ladder decode ms/tok | no-comm decode ms/tok "
        "| comm share | ladder decode-step speedup | parallel tokens/s speedup | ceiling tokens/s speedup |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        "| NVLink | 4 | 187 | 14.63 | 11.93 | 11.54 | 25.0 % | 1.227x | 1.134x | 1.271x |\n"
        "| P2P disabled | 4 | 922 | 20.00 | 12.50 | 10.00 | 50.0 % | 1.600x | 1.300x | 1.738x |\n"
        "\n"
        "Predicted (every row has `prediction: true`) for llama-70b on the h100 profile, TP 8, prompt 1024, 512 new "
        "tokens; the 8 rows are in `x.jsonl`.\n"
    )


def test_the_prediction_grid_refuses_a_file_appended_to_twice_or_mixing_models():
    with pytest.raises(ValueError, match="two rows for link nvlink, batch 4, standard"):
        predict_tables.prediction_grid(GRID + GRID[:1], "x.jsonl")
    other = [{**row, "model": "llama-8b"} if row["link"] == "pcie" else row for row in GRID]
    with pytest.raises(ValueError, match="more than one model"):
        predict_tables.prediction_grid(other, "x.jsonl")


def _errors(first: float, last: float) -> dict[str, float]:
    cells = [cell for _, cell in predict_tables.SHOWN_CELLS]
    return {cells[0]: first, cells[1]: -0.276, cells[2]: -0.044, cells[3]: -0.058, cells[4]: last}


SENSITIVITY = [
    {"assumption": "none", "keys": [], "shipped": None, "value": None, "mean_abs_error_12": 0.0614},
    {"assumption": "`mem_eff`", "keys": ["mem_eff"], "shipped": 0.8, "value": 0.7, "mean_abs_error_12": 0.08849},
    {"assumption": "`mem_eff`", "keys": ["mem_eff"], "shipped": 0.8, "value": 0.9, "mean_abs_error_12": 0.0481},
    {"assumption": "`i`", "keys": ["links.a.i", "links.b.i"], "shipped": 0.12, "value": 0.0, "mean_abs_error_12": 0.05},
]


def test_the_sensitivity_table_sets_each_assumptions_alternatives_side_by_side():
    errors = [_errors(-0.038, 0.005), _errors(-0.11, 0.003), _errors(0.0259, 0.008), _errors(-0.038, 0.0234)]
    rows = [
        {**row, "errors": e, "profile": "h100", "command": "make it"}
        for row, e in zip(SENSITIVITY, errors, strict=True)
    ]
    assert predict_tables.sensitivity(rows, "s.jsonl") == (
        "| changed assumption: alternatives (shipped) | mean abs error, 12 cells | standard tok/s NVLink, batch 1 "
        "| standard tok/s NVLink, batch 64 | NVLink ladder, batch 1 | P2P-off ladder, batch 1 "
        "| P2P-off ladder, batch 64 |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
        "| none (the shipped profile) | 6.1 % | -3.8 % | -27.6 % | -4.4 % | -5.8 % | +0.5 % |\n"
        "| `mem_eff` 0.7 / 0.9 (0.8) | 8.8 % / 4.8 % | -11.0 / +2.6 % | -27.6 / -27.6 % | -4.4 / -4.4 % "
        "| -5.8 / -5.8 % | +0.3 / +0.8 % |\n"
        "| `i` 0 (0.12) | 5.0 % | -3.8 % | -27.6 % | -4.4 % | -5.8 % | +2.3 % |\n"
        "\n"
        "Predicted. Error = predicted / paper - 1 in a cell of the paper's 70B table; the mean is over the 12 cells "
        "other than standard's P2P-disabled tokens/s. Each row but the first: a copy of the shipped h100 profile "
        "with that one value changed (`i` sets `links.a.i` and `links.b.i`), read as `--profile` reads it; not "
        "adopted. The rows are in `s.jsonl`, written by `make it`.\n"
    )


def test_the_docs_blocks_are_registered_and_equal_what_the_committed_rows_give():
    """What ``docs_tables --check`` checks (tests/test_docs.py, for every table), for these two blocks alone."""
    text = (ROOT / "docs/benchmarks.md").read_text()
    for name in NAMES:
        assert name in TABLES
        block = re.search(rf"<!-- table {name}: [^\n]*-->\n(.*?)<!-- end table -->", text, re.S)
        assert block, name
        assert block.group(1) == make_table(name, ROOT)


def _committed(relative: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / relative).read_text().splitlines() if line.strip()]


def test_the_committed_prediction_grid_is_what_the_predictor_gives():
    """The command beside the table, run as the code stands: a change of the model or the profile must regenerate
    docs/results/predict/llama70b_tp8.jsonl."""
    options = PredictOptions(models=("llama-70b",), gpus=("h100",), links=("nvlink", "pcie"), tps=(8,))
    ours = prediction_rows(options)
    theirs = _committed(LLAMA70B_TP8)
    assert [(r["link"], r["batch"], r["layout"]) for r in ours] == [
        (r["link"], r["batch"], r["layout"]) for r in theirs
    ]
    for mine, committed in zip(ours, theirs, strict=True):
        numbers = {k for k, v in committed.items() if isinstance(v, float)}
        assert {k: mine[k] for k in numbers} == pytest.approx({k: committed[k] for k in numbers}, rel=1e-9)
        assert {k: v for k, v in mine.items() if k not in numbers} == {
            k: v for k, v in committed.items() if k not in numbers
        }


def test_the_committed_sensitivity_rows_are_what_the_benchmark_gives():
    theirs = _committed(SENSITIVITY_FILE)
    ours = predictor_sensitivity.sensitivity_rows()
    assert len(ours) == len(theirs) == 1 + sum(len(values) for _, _, values in predictor_sensitivity.CHANGES)
    for mine, committed in zip(ours, theirs, strict=True):
        assert committed["command"] == "python -m benchmarks.predictor_sensitivity --out " + SENSITIVITY_FILE
        assert committed["errors"] == pytest.approx(mine["errors"], rel=1e-9)
        assert committed["mean_abs_error_12"] == pytest.approx(mine["mean_abs_error_12"], rel=1e-9)
        rest = ("assumption", "keys", "shipped", "value", "profile", "prediction")
        assert {k: committed[k] for k in rest} == {k: mine[k] for k in rest}
        assert set(committed) == {*mine, "command"}


def test_a_sensitivity_profile_differs_from_the_shipped_one_in_its_keys_only():
    shipped = predictor_sensitivity.shipped_entry()
    keys = ("links.nvlink.interference", "links.pcie.interference")
    copy = predictor_sensitivity.changed(shipped, keys, 0.25)
    assert copy["links"]["nvlink"]["interference"] == copy["links"]["pcie"]["interference"] == 0.25
    assert copy["links"]["ib"] == shipped["links"]["ib"] and shipped["links"]["pcie"]["interference"] == 0.12
    copy["links"]["nvlink"]["interference"] = copy["links"]["pcie"]["interference"] = 0.12
    assert copy == shipped
    assert predictor_sensitivity.shipped_value(shipped, keys) == 0.12
