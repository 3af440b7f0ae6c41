"""The measured rows' one reader (``bench_schema.read_bench``, with ``predict/rows.py`` for gpu_check's rows) and the
three commands that read rows through it: ``ladder-predict --compare``, ``ladder-predict fit`` and ``ladder-report
--bench``. A line that is not a JSON object, NaN, a figure given as a string, a time or a batch that is not positive:
one line naming the file, the line and the field, exit 2, before anything is predicted or written. A row of a card no
profile describes is refused, naming the card and the profiles; a fit checked on its own card is refused; where the
card's copy rate is not measured, the table says the figure is the profile's."""

import json
from pathlib import Path

import pytest
from cli_errors import assert_bad_input

from ladder_train.predict import fit
from ladder_train.predict.hardware import load_profiles

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
BENCH_ROW = json.loads((RESULTS / "tp_generation" / "cpu.jsonl").read_text().splitlines()[0])  # ladder-bench, CPU


def decode_row(n_layers: int = 8, device: str = "NVIDIA H100 80GB HBM3", **fields) -> dict:
    """A gpu_check decode row (benchmarks/gpu_rows.py) of the 1.2B preset's first ``n_layers`` layers."""
    row = {"kind": "decode", "layout": "standard", "model": "1.2B", "n_layers": n_layers, "batch": 1}
    row |= {
        "compiled": True,
        "prompt_len": 512,
        "gen_len": 256,
        "tpot_ms": 0.5 + 0.05 * int(n_layers),
        "prefill_ms": 4.0,
    }
    return {**row, "device": device, "error": None, **fields}


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def commands(path: Path, other: Path, out: Path) -> dict[str, list[str]]:
    """Each reader's command line on ``path`` (``other``: fit's --check rows, ``out``: ladder-report's folder)."""
    return {
        "compare": ["ladder-predict", "--compare", str(path)],
        "fit": ["ladder-predict", "fit", str(path), "--check", str(other)],
        "report": ["ladder-report", "--bench", str(path), "--out", str(out)],
    }


def assert_each_refuses(tmp_path, path: Path, named: tuple[str, ...], capsys, monkeypatch, only=None):
    other = write_lines(tmp_path / "h200.jsonl", json.dumps(decode_row(device="NVIDIA H200")))
    for name, (prog, *argv) in commands(path, other, tmp_path / "report").items():
        if only is None or name in only:
            assert_bad_input(prog, argv, named, capsys, monkeypatch)
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    "line,kind", [("[1, 2]", "a list"), ("3", "a int"), ("null", "a NoneType"), ('"row"', "a str")]
)
def test_a_line_that_is_not_an_object_is_refused_naming_file_and_line(line, kind, tmp_path, capsys, monkeypatch):
    path = write_lines(tmp_path / "rows.jsonl", json.dumps(BENCH_ROW), line)
    assert_each_refuses(tmp_path, path, (f"{path}:2", "not a JSON object", kind), capsys, monkeypatch)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_naming_file_and_line(constant, tmp_path, capsys, monkeypatch):
    text = json.dumps({**BENCH_ROW, "decode_ms_per_token": 1.0}).replace("1.0", constant, 1)
    path = write_lines(tmp_path / "rows.jsonl", text)
    assert_each_refuses(tmp_path, path, (f"{path}:1", constant), capsys, monkeypatch)


BAD_FIGURES = [
    ("decode_ms_per_token", "2.5", "must be a positive number"),
    ("decode_ms_per_token", -1.0, "must be a positive number"),
    ("decode_ms_per_token", 0, "must be a positive number"),
    ("prefill_ms", -2.0, "must be a positive number"),
    ("tokens_per_s", 0.0, "must be a positive number"),
    ("batch", 0, "must be a positive integer"),
    ("batch", "4", "must be a positive integer"),
    ("batch", 1.5, "must be a positive integer"),
    ("tp", True, "must be a positive integer"),
    ("layout", 3, "must be a string"),
]


@pytest.mark.parametrize("key,value,rule", BAD_FIGURES)
def test_a_bench_row_figure_that_is_not_a_positive_number_is_refused(key, value, rule, tmp_path, capsys, monkeypatch):
    path = write_lines(tmp_path / "rows.jsonl", json.dumps(BENCH_ROW), json.dumps({**BENCH_ROW, key: value}))
    assert_each_refuses(tmp_path, path, (f"{path}:2", f"{key}={value!r}", rule), capsys, monkeypatch)


NESTED = [
    ("none", 5, "none=5", "must be an object"),
    ("ttft_ms", 3, "ttft_ms=3", "must be an object"),
    ("tpot_ms", {"p50": "x"}, "tpot_ms.p50='x'", "must be a positive number"),
    ("tokens_per_s_runs", {"samples": "ab"}, "tokens_per_s_runs.samples='ab'", "must be a list of positive numbers"),
    ("module_ms", 1, "module_ms=1", "must be an object"),
    ("emulated_link_latency_ms", "1", "emulated_link_latency_ms='1'", "must be a number >= 0"),
    ("link_bandwidth_gbs", -1, "link_bandwidth_gbs=-1", "must be a positive number"),
    ("speedup_vs_standard", "1", "speedup_vs_standard='1'", "must be a positive number"),
    ("comm_share", "x", "comm_share='x'", "must be a number"),
    ("compiled", "yes", "compiled='yes'", "must be true or false"),
    ("shape", 5, "shape=5", "must be a string"),
]


@pytest.mark.parametrize("key,value,named,rule", NESTED, ids=[n for _, _, n, _ in NESTED])
def test_a_bench_row_object_or_figure_of_the_wrong_kind_is_refused(
    key, value, named, rule, tmp_path, capsys, monkeypatch
):
    path = write_lines(tmp_path / "rows.jsonl", json.dumps({**BENCH_ROW, key: value}))
    assert_each_refuses(tmp_path, path, (f"{path}:1", named, rule), capsys, monkeypatch)


def test_a_decode_row_names_a_preset_never_a_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    path = write_lines(tmp_path / "check.jsonl", json.dumps(decode_row(model=str(tmp_path))))
    named = (f"{path}:1", f"model {str(tmp_path)!r}: not a preset")
    assert_each_refuses(tmp_path, path, named, capsys, monkeypatch, only=("compare", "fit"))


def test_the_no_communication_figures_are_checked_too(tmp_path, capsys, monkeypatch):
    row = {**BENCH_ROW, "none": {**BENCH_ROW["none"], "decode_ms_per_token": -3.0}}
    path = write_lines(tmp_path / "rows.jsonl", json.dumps(row))
    named = (f"{path}:1", "none.decode_ms_per_token=-3.0", "must be a positive number")
    assert_each_refuses(tmp_path, path, named, capsys, monkeypatch)


@pytest.mark.parametrize(
    "key,value,rule",
    [("tpot_ms", -1.0, "number"), ("tpot_ms", "1.2", "number"), ("prefill_ms", 0, "number"), ("batch", 0, "integer")]
    + [("n_layers", "8", "integer"), ("gen_len", -256, "integer")],
)
def test_a_gpu_check_decode_row_figure_that_is_not_positive_is_refused(key, value, rule, tmp_path, capsys, monkeypatch):
    path = write_lines(tmp_path / "check.jsonl", json.dumps(decode_row()), json.dumps(decode_row(**{key: value})))
    named = (f"{path}:2", f"{key}={value!r}", f"must be a positive {rule}")
    assert_each_refuses(tmp_path, path, named, capsys, monkeypatch, only=("compare", "fit"))


def test_a_ceilings_copy_rate_that_is_not_positive_is_refused(tmp_path, capsys, monkeypatch):
    ceilings = {"kind": "ceilings", "copy_tb_s_median": -2.0, "error": None}
    path = write_lines(tmp_path / "check.jsonl", json.dumps(decode_row()), json.dumps(ceilings))
    named = (f"{path}:2", "copy_tb_s_median=-2.0", "must be a positive number")
    assert_each_refuses(tmp_path, path, named, capsys, monkeypatch, only=("fit",))


def test_a_row_of_a_card_without_a_profile_is_refused_naming_the_card_and_the_profiles(tmp_path, capsys, monkeypatch):
    path = write_lines(tmp_path / "b200.jsonl", json.dumps(decode_row(device="NVIDIA B200")))
    named = (f"{path}:1", "'NVIDIA B200'", "h100, h200, a100, cpu", "--gpu")
    assert_each_refuses(tmp_path, path, named, capsys, monkeypatch, only=("compare", "fit"))
    bench = write_lines(tmp_path / "bench.jsonl", json.dumps({**BENCH_ROW, "device": "NVIDIA B200"}))
    assert_each_refuses(tmp_path, bench, (f"{bench}:1", "'NVIDIA B200'"), capsys, monkeypatch, only=("compare",))


def test_a_fit_checked_on_the_card_it_was_fitted_on_is_refused(tmp_path, capsys, monkeypatch):
    h100 = write_lines(tmp_path / "h100.jsonl", *(json.dumps(decode_row(n)) for n in (8, 40)))
    again = write_lines(tmp_path / "h100_again.jsonl", json.dumps(decode_row(16)))
    for check in (h100, again):
        argv = ["fit", str(h100), "--check", str(check)]
        assert_bad_input("ladder-predict", argv, ("--check", "h100", "another card"), capsys, monkeypatch)


def test_the_mem_eff_label_says_where_each_cards_figure_comes_from(tmp_path):
    devices = load_profiles()
    ceilings = {"kind": "ceilings", "copy_tb_s_median": 0.55 * devices["h100"].mem_bw / 1e12, "error": None}
    h100 = write_lines(tmp_path / "h100.jsonl", *(json.dumps(decode_row(n)) for n in (8, 40)), json.dumps(ceilings))
    h200 = write_lines(tmp_path / "h200.jsonl", *(json.dumps(decode_row(n, "NVIDIA H200")) for n in (8, 40)))
    result = fit.card_check([h100], [h200], devices, (fit.FREE,))
    label = fit.table_rows(result)[len(result["shipped"])][0]
    profile = devices["h200"].mem_eff
    assert label == (
        f"`compute_eff`, `kernel_us` (`mem_eff`: h100's measured copy rate / datasheet; h200's profile value "
        f"{profile:g}, no copy rate measured)"
    )
    fitted_on_h200 = [row for row in fit.table_rows(result) if row[1].startswith("h200")][0]
    assert fitted_on_h200[5] == f"{profile:.3f}"  # the h200 rows predicted with its profile's mem_eff, as labelled


@pytest.mark.parametrize("row", [{}, {"layout": "standard", "batch": 1}, {**BENCH_ROW, "tokens_per_s": None}])
def test_ladder_report_refuses_a_row_without_what_its_table_reads(row, tmp_path, capsys, monkeypatch):
    path = write_lines(tmp_path / "rows.jsonl", json.dumps(BENCH_ROW), json.dumps(row))
    named = (f"{path}:2", "missing key", "or null")
    assert_each_refuses(tmp_path, path, named, capsys, monkeypatch, only=("report",))
