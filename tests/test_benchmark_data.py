"""The benchmarks' raw data and the docs' tables made from it: each benchmark, run with tiny settings, appends the
rows its table needs (command, host, settings, every repeat's samples), checks it did the work it timed, and the
table the docs_tables tool's manifest names renders the medians and ranges of those rows."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import pytest
import torch
from launch import TINY_TRAINING, end, run_from_repo, start

from benchmarks.checkpoint_stall import expected_saves
from benchmarks.data_loader import check_delivered
from benchmarks.records import BenchmarkError
from benchmarks.train_step import check_optimizer_steps
from tools.docs_tables import MANIFEST, TABLES, bench_tables, remake, stale_tables, tp_tables

REPO = Path(__file__).resolve().parents[1]
# the data files of the tables these tests make, as the manifest names them
TRAINER_OVERHEAD = MANIFEST["trainer-overhead"].rows
DATA_PIPELINE = MANIFEST["data-pipeline"].rows
CHECKPOINT = MANIFEST["checkpoint-stall"].rows
FSDP_UNITS = MANIFEST["fsdp-units"].rows
SMOKE_WORKERS = MANIFEST["smoke-workers"].rows
COMPILED_LOSS = MANIFEST["compiled-loss"].rows
TP_GENERATION = MANIFEST["tp-generation"].rows
LINK_SWEEP = MANIFEST["tp-link-sweep"].rows
OVERLAP_CHECKS = MANIFEST["tp-overlap-checks"].rows
TP_COMPILED = MANIFEST["tp-compiled"].rows
PREDICT_CPU = MANIFEST["predict-cpu"].data["folders"]
TINY = TINY_TRAINING
TP_TINY = [
    "--model",
    "tiny",
    "--set",
    "dim=64",
    "n_layers=2",
    "n_heads=4",
    "n_kv_heads=4",
    "ffn_dim=128",
    "vocab_size=128",
    "max_seq_len=32",
    "--tp",
    "2",
    "--batch-sizes",
    "1",
    "--prompt-len",
    "4",
    "--gen-len",
    "3",
    "--runs",
    "2",
    "--warmup",
    "1",
]
CONTEXT = {"invocation", "command", "date", "started", "host", "bench", "repeat"}
HOST = {"cpu_model", "cpu_count", "cpus_usable", "torch_threads", "omp_num_threads", "versions"}


def run_module(tmp_path: Path, module: str, args: list[str]) -> subprocess.CompletedProcess:
    done = run_from_repo(tmp_path, "-m", module, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def spread_of(values: list[float], spec: str, suffix: str = "") -> str:
    """What a table cell must show: the median and, where they differ, the lowest and highest."""
    mid, low, high = (format(v, spec) for v in (statistics.median(values), min(values), max(values)))
    return mid + suffix if low == high else f"{mid}{suffix} ({low}–{high}{suffix})"


def table_row(table: str, *first_cells: str) -> list[str]:
    """The cells of the markdown row that starts with ``first_cells``."""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[: len(first_cells)] == list(first_cells):
            return cells
    raise AssertionError(f"no row {first_cells} in\n{table}")


def place(root: Path, relative: str, rows: list[dict]) -> None:
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    (root / relative).write_text("".join(json.dumps(row) + "\n" for row in rows))


# the checks that a measurement did its work -------------------------------------------------------------------


def test_spread_is_the_median_with_the_lowest_and_highest():
    assert bench_tables.spread([300.0, 100.0, 250.0], ",.0f") == "250 (100–300)"
    assert bench_tables.spread([1.5, 2.5], ".2f", "×") == "2.00× (1.50–2.50×)"
    assert bench_tables.spread([0.1234], ".3f") == "0.123"
    assert bench_tables.spread([1.0001, 1.0002], ".2f") == "1.00"  # all print the same: no range


def test_a_loader_pass_that_delivered_too_few_or_too_many_tokens_is_refused():
    check_delivered(10 * 33, 10 * 33 + 20, workers=1, batch_size=2, seq_len=32)  # the last partial window dropped
    for delivered in (0, 1000 + 1, 1000 - 2 * 3 * 33 - 1):  # nothing; more than the raw tokens; too many dropped
        with pytest.raises(BenchmarkError, match="delivered"):
            check_delivered(delivered, 1000, workers=2, batch_size=2, seq_len=32)


def test_a_bare_loop_whose_optimizer_did_not_step_each_time_is_refused():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    check_optimizer_steps(optimizer, 2)
    with pytest.raises(BenchmarkError, match=r"stepped \[2\] times instead of 3"):
        check_optimizer_steps(optimizer, 3)


def test_expected_saves_count_the_periodic_ones_and_the_last():
    assert [expected_saves(30, 10), expected_saves(30, 0), expected_saves(5, 2), expected_saves(4, 2)] == [3, 1, 3, 2]


def _overhead_rows() -> list[dict]:
    """Three repeats of two rounds each, as benchmarks/train_step.py writes them (the figures made up)."""
    host = {"cpu_model": "Test CPU", "cpu_count": 2, "versions": {"torch": "2.13.0+cpu"}}
    model = {"residual": "ladder", "n_layers": 4, "dim": 256, "n_heads": 4, "ffn_dim": 688, "vocab_size": 8192}
    common = {
        "invocation": "i1",
        "command": "python -m benchmarks.train_step --repeats 3",
        "date": "2026-11-26",
        "host": host,
        "rounds": 2,
        "model": model,
        "parameters": 7_300_000,
        "seq_len": 256,
        "global_batch_size": 8,
        "micro_batch_size": 4,
        "dtype": "float32",
        "device": "cpu",
        "steps": 10,
    }
    rates = {"bare": [(100, 110), (120, 90), (105, 95)], "trainer": [(90, 100), (100, 80), (99, 97)]}
    return [
        {**common, "repeat": k, "loop": loop, "round": i, "tokens_per_s": rate}
        for k in range(3)
        for loop in rates
        for i, rate in enumerate(rates[loop][k])
    ]


def test_a_marked_table_is_made_from_its_rows_and_an_edited_number_is_caught(tmp_path):
    place(tmp_path, TRAINER_OVERHEAD, _overhead_rows())
    doc = "docs/benchmarks.md"
    (tmp_path / "docs" / "benchmarks.md").write_text(
        "<!-- table trainer-overhead: python -m benchmarks.train_step --out ... -->\nold\n<!-- end table -->\n"
    )
    assert stale_tables(tmp_path, (doc,)) == [f"{doc}: trainer-overhead"]
    made = remake((tmp_path / doc).read_text(), tmp_path)
    # best rounds: bare 110, 120, 105; trainer 100, 100, 99; trainer / bare 0.909, 0.833, 0.943 within each repeat
    assert "| bare loop | 110 (105–120) | 1.000 |" in made
    assert "| trainer | 100 (99–100) | 0.909 (0.833–0.943) |" in made
    assert "Overhead (1 - trainer / bare): 9.1 % (5.7–16.7 %) over 3 samples" in made
    assert "Measured 2026-11-26 on Test CPU (2 cores), torch 2.13.0+cpu: 3 samples from 1 invocation" in made
    (tmp_path / doc).write_text(made)
    assert stale_tables(tmp_path, (doc,)) == []
    (tmp_path / doc).write_text(made.replace("0.909 (", "0.919 ("))
    assert stale_tables(tmp_path, (doc,)) == [f"{doc}: trainer-overhead"]


# the developer benchmarks, run tiny ---------------------------------------------------------------------------


@pytest.mark.slow
def test_data_loader_rows_and_their_table(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for part in range(2):  # two files: each of 2 workers reads one
        (source / f"part{part}.jsonl").write_text(
            "".join(
                json.dumps({"text": f"document {part} {i} " + "lorem ipsum " * (i % 7 + 3)}) + "\n" for i in range(60)
            )
        )
    out = tmp_path / DATA_PIPELINE
    args = ["--source", str(source), "--tokenizer", "byte", "--seq-len", "31", "--batch-size", "2"]
    run_module(tmp_path, "benchmarks.data_loader", [*args, "--workers", "0", "2", "--repeats", "2", "--out", str(out)])
    rows = read(out)
    assert [(r["repeat"], r["quantity"], r["call"] or r["workers"]) for r in rows] == [
        (repeat, *kind)
        for repeat in (0, 1)
        for kind in (("raw", "encode_batch"), ("raw", "encode_batch_fast"), ("pipeline", 0), ("pipeline", 2))
    ]
    assert all(
        CONTEXT | {"tokens", "seconds", "tokens_per_s", "seq_len", "batch_size", "documents"} <= set(r) for r in rows
    )
    assert HOST <= set(rows[0]["host"]) and rows[0]["host"]["versions"]["tokenizers"]
    assert rows[0]["command"].endswith("--repeats 2 --out " + str(out)) and rows[0]["documents"] == 120
    assert len({r["tokens"] for r in rows if r["quantity"] == "raw"}) == 1  # both calls, both repeats: same count
    assert all(0 < r["tokens"] <= rows[0]["tokens"] for r in rows)

    table = TABLES["data-pipeline"](tmp_path)
    fast = [r["tokens_per_s"] for r in rows if r["call"] == "encode_batch_fast"]
    assert table_row(table, "raw `encode_batch_fast`, 1 thread")[2] == spread_of(fast, ",.0f")
    two = [r["tokens_per_s"] for r in rows if r["workers"] == 2]
    per_fast = [t / 2 / f for t, f in zip(two, fast, strict=True)]  # within each repeat
    assert table_row(table, "pipeline, 2 workers") == [
        "pipeline, 2 workers",
        "2",
        spread_of(two, ",.0f"),
        spread_of([t / 2 for t in two], ",.0f"),
        spread_of([t / 2 / r["tokens_per_s"] for t, r in zip(two, rows[::4], strict=True)], ".2f"),
        spread_of(per_fast, ".2f"),
    ]
    assert "2 samples from 1 invocation" in table and f"{rows[0]['tokens']:,} tokens" in table


@pytest.mark.slow
def test_train_step_rows_and_their_table(tmp_path):
    out = tmp_path / TRAINER_OVERHEAD
    run_module(
        tmp_path, "benchmarks.train_step", ["--steps", "2", "--rounds", "2", "--repeats", "2", "--out", str(out), *TINY]
    )
    rows = read(out)
    assert [(r["repeat"], r["loop"], r["round"]) for r in rows] == [
        (repeat, loop, i) for repeat in (0, 1) for loop in ("bare", "trainer") for i in (0, 1)
    ]
    assert all(CONTEXT | {"steps", "tokens_per_s", "model", "parameters", "dtype"} <= set(r) for r in rows)
    assert {r["steps"] for r in rows} == {2} and rows[0]["tokens_per_step"] == 32

    def best(loop):
        return [max(r["tokens_per_s"] for r in rows if r["repeat"] == k and r["loop"] == loop) for k in (0, 1)]

    table = TABLES["trainer-overhead"](tmp_path)
    ratio = [t / b for t, b in zip(best("trainer"), best("bare"), strict=True)]
    assert table_row(table, "bare loop") == ["bare loop", spread_of(best("bare"), ",.0f"), "1.000"]
    assert table_row(table, "trainer") == ["trainer", spread_of(best("trainer"), ",.0f"), spread_of(ratio, ".3f")]
    assert f"Overhead (1 - trainer / bare): {spread_of([100 * (1 - x) for x in ratio], '.1f', ' %')}" in table


@pytest.mark.slow
def test_checkpoint_rows_and_their_two_tables(tmp_path):
    out = tmp_path / CHECKPOINT
    run_module(
        tmp_path,
        "benchmarks.checkpoint_stall",
        ["--steps", "4", "--every", "2", "--dims", "32", "--repeats", "2", "--out", str(out), *TINY],
    )
    rows = read(out)
    assert [(r["repeat"], r["part"], r.get("setting") or r["dim"]) for r in rows] == [
        (k, *kind)
        for k in (0, 1)
        for kind in (("stall", "end only"), ("stall", "every 2, sync"), ("stall", "every 2, async"), ("size", 32))
    ]
    stalls = [r for r in rows if r["part"] == "stall"]
    assert [len(r["step_s"]) for r in stalls] == [4] * 6 and [r["saves"] for r in stalls[:3]] == [1, 2, 2]
    sizes = [r for r in rows if r["part"] == "size"]
    assert all(CONTEXT <= set(r) and r["bytes"] > 0 and r["save_s"] > 0 for r in rows[3::4])

    table = TABLES["checkpoint-stall"](tmp_path)
    sync = [r for r in stalls if r["setting"] == "every 2, sync"]
    assert table_row(table, "every 2, sync") == [
        "every 2, sync",
        "2",
        spread_of([r["total_s"] for r in sync], ".2f"),
        spread_of([r["median_step_s"] for r in sync], ".3f"),
        spread_of([r["stall_per_save_s"] for r in sync], ".3f"),
    ]
    assert table_row(table, "end only")[-1] == "-"
    table = TABLES["checkpoint-size"](tmp_path)
    assert table_row(table, "32")[1:] == [
        f"{sizes[0]['params']:,}",
        f"{sizes[0]['bytes'] / 2**20:,.1f}",
        spread_of([r["save_s"] for r in sizes], ".3f"),
        spread_of([r["load_s"] for r in sizes], ".3f"),
        spread_of([r["bytes"] / 2**20 / r["save_s"] for r in sizes], ",.0f"),
    ]


@pytest.mark.slow
def test_a_training_that_skipped_its_periodic_saves_is_refused(tmp_path):
    code = f"""
from benchmarks import checkpoint_stall as bench
bench.Checkpointer.maybe_save = lambda self, *args: False  # the saves the timing assumes are gone
bench.main(['--steps', '4', '--every', '2', '--dims', '32', *{TINY!r}])
"""
    done = run_from_repo(tmp_path, "-c", code)
    assert done.returncode != 0
    assert "BenchmarkError: training in every 2, sync ran 4 steps (4 logged) and saved at steps [4]" in done.stderr


# ladder-bench, run tiny: three invocations, two of them at the same link ----------------------------------------


@pytest.fixture(scope="module")
def tp_rows(tmp_path_factory) -> list[dict]:
    """The rows of three TP = 2 ladder-bench invocations: two with an emulated link of 1 ms, one of 3 ms, run side by
    side (their timings mean nothing; their shape is what is tested)."""
    folder = tmp_path_factory.mktemp("tp")
    outs = [folder / f"{i}.jsonl" for i in range(3)]
    bench = ["-m", "ladder_train.bench", *TP_TINY]
    running = [
        start(*bench, "--link-latency-ms", x, "--out", out, cwd=folder, stdout=subprocess.DEVNULL)
        for x, out in zip((1, 1, 3), outs, strict=True)
    ]
    try:
        for process in running:
            _, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-3000:]
    finally:
        for process in running:
            end(process)
    return [row for out in outs for row in read(out)]


def by_layout(rows: list[dict], x: float, layout: str) -> list[dict]:
    return [r for r in rows if r["emulated_link_latency_ms"] == x and r["layout"] == layout]


@pytest.mark.slow
def test_ladder_bench_rows_say_which_invocation_wrote_them(tp_rows):
    assert len(tp_rows) == 9 and len({r["invocation"] for r in tp_rows}) == 3
    assert all({"started", "cpu_model", "date", "tokens_per_s_runs", "none", "module_ms"} <= set(r) for r in tp_rows)
    assert [len(group) for group in tp_tables.invocations(tp_rows)] == [3, 3, 3]
    # rows of an older ladder-bench, without the id: the second invocation of the same cases starts where one repeats
    anonymous = [{k: v for k, v in r.items() if k not in ("invocation", "started")} for r in tp_rows[:6]]
    assert tp_tables.invocations(anonymous) == [anonymous[:3], anonymous[3:]]


@pytest.mark.slow
def test_the_tp_generation_table_gives_medians_and_ranges_over_invocations(tmp_path, tp_rows):
    place(tmp_path, TP_GENERATION, [r for r in tp_rows if r["emulated_link_latency_ms"] == 1])
    table = TABLES["tp-generation"](tmp_path)
    ladder = by_layout(tp_rows, 1, "ladder")
    assert table_row(table, "ladder", "1") == [
        "ladder",
        "1",
        spread_of([r["tokens_per_s"] for r in ladder], ",.1f"),
        spread_of([r["decode_ms_per_token"] for r in ladder], ".2f"),
        spread_of([r["speedup_vs_standard"] for r in ladder], ".3f", "×"),
        spread_of([r["decode_speedup_vs_standard"] for r in ladder], ".3f", "×"),
        spread_of([r["none"]["tokens_per_s"] for r in ladder], ",.1f"),
        spread_of([100 * r["comm_share"] for r in ladder], ".1f", " %"),
        spread_of([100 * r["overlap_efficiency"] for r in ladder], ".0f", " %"),
        spread_of([r["none"]["decode_ms_per_token"] for r in ladder], ".1f"),
    ]
    assert table_row(table, "parallel", "1")[8] == "—"  # no overlap efficiency: it halves its all-reduces instead
    assert "2 invocations: per case the median over its 2" in table and "Emulated X = 1 ms is" in table


@pytest.mark.slow
def test_the_link_sweep_and_overlap_tables(tmp_path, tp_rows):
    from ladder_train.report.link_sweep import module_ms, predicted_decode_ms

    place(tmp_path, LINK_SWEEP, tp_rows)
    place(tmp_path, OVERLAP_CHECKS, tp_rows)
    sweep = TABLES["tp-link-sweep"](tmp_path)
    standard, ladder = by_layout(tp_rows, 1, "standard"), by_layout(tp_rows, 1, "ladder")
    predicted = [predicted_decode_ms(s, 1) / predicted_decode_ms(r, 1) for s, r in zip(standard, ladder, strict=True)]
    assert table_row(sweep, "1", spread_of([1 / module_ms(s) for s in standard], ".2f"), "ladder")[3:] == [
        spread_of([r["decode_ms_per_token"] for r in ladder], ".1f"),
        spread_of([r["speedup_vs_standard"] for r in ladder], ".2f", "×"),
        spread_of([r["decode_speedup_vs_standard"] for r in ladder], ".2f", "×"),
        spread_of(predicted, ".2f", "×"),
        spread_of([100 * r["overlap_efficiency"] for r in ladder], ".0f", " %"),
        spread_of([r["none"]["decode_ms_per_token"] for r in ladder], ".1f"),
    ]
    (one,) = by_layout(tp_rows, 3, "ladder")  # one invocation: single values, no range
    assert table_row(sweep, "3")[3] == f"{by_layout(tp_rows, 3, 'standard')[0]['decode_ms_per_token']:.1f}"
    assert table_row(sweep, "3", table_row(sweep, "3")[1], "ladder")[7] == f"{100 * one['overlap_efficiency']:.0f} %"
    checks = TABLES["tp-overlap-checks"](tmp_path)
    shorter = min(standard[0]["module_ms"].values()), min(standard[1]["module_ms"].values())
    assert table_row(checks, "hidden 64, 2 layers, batch 1", "1")[2] == spread_of([1 / m for m in shorter], ".2f")


@pytest.mark.slow
def test_the_compiled_path_table_counts_each_invocations_graphs(tmp_path, tp_rows):
    """Rows as a compiled invocation writes them (compiled, backend, its compilations): 3 layouts x {real, none}
    x 1 batch size may compile 12 graphs; the table shows each invocation's count beside that."""
    compiled = [
        {**r, "compiled": True, "compile_backend": "inductor", "compilations": 12 - i // 3}
        for i, r in enumerate(tp_rows[:6])
    ]
    place(tmp_path, TP_COMPILED, compiled)
    table = TABLES["tp-compiled"](tmp_path)
    assert table_row(table, "1", "ladder") == [
        "1",
        "ladder",
        "1",
        "yes",
        "inductor",
        str(compiled[0]["gen_len"]),
        str(compiled[0]["runs"]),
        "12",
        "12",
    ]
    assert table_row(table, "2", "standard")[7:] == ["11", "12"]
    assert f"rows in `{TP_COMPILED}`" in table


@pytest.mark.slow
def test_the_predictor_table_compares_each_validate_folder_with_its_own_profile(tmp_path, tp_rows):
    import yaml

    from ladder_train.predict.compare import compare_with_bench
    from ladder_train.predict.hardware import load_profiles

    shipped = yaml.safe_load((REPO / "ladder_train/predict/hardware.yaml").read_text())["cpu"]
    faster = {**shipped, "attention_overhead_us": shipped["attention_overhead_us"] / 2}  # another calibration
    errors, predicted = [], []
    for i, (profile, rows) in enumerate(((shipped, tp_rows[:3]), (faster, tp_rows[3:6]))):  # the two X = 1 ms runs
        place(tmp_path, f"{PREDICT_CPU}/run{i}/bench.jsonl", rows)
        folder = tmp_path / PREDICT_CPU / f"run{i}"
        (folder / "cpu.yaml").write_text(yaml.safe_dump({"cpu": profile}))
        results, summary = compare_with_bench(
            tp_tables.bench_rows(folder / "bench.jsonl"), load_profiles(folder / "cpu.yaml")["cpu"]
        )
        errors.append(100 * summary["decode"])
        predicted.append(next(r["pred_decode_ms"] for r in results if r["layout"] == "ladder"))
    assert predicted[0] != predicted[1]
    table = TABLES["predict-cpu"](tmp_path)
    assert f"Mean absolute errors: decode time {spread_of(errors, '.1f', ' %')}" in table
    ladder = by_layout(tp_rows[:6], 1, "ladder")
    assert table_row(table, ladder[0]["shape"], "ladder", "1", "1")[4:6] == [
        spread_of(predicted, ".1f"),
        spread_of([r["decode_ms_per_token"] for r in ladder], ".1f"),
    ]


@pytest.mark.slow
def test_train_ab_rows_their_pairs_and_their_table(tmp_path):
    """Two settings side by side, eager so that nothing is generated: FSDP's two accumulation modes (bf16, one
    process)."""
    out = tmp_path / FSDP_UNITS
    variants = ["--a", "parallel.accumulate=unsharded", "--b", "parallel.accumulate=sharded"]
    args = ["--steps", "4", "--rounds", "2", *variants, "--out", str(out), *TINY, "parallel.compile=false"]
    args.append("train.dtype=bf16")  # FSDP's: one fp32 process would train without it
    done = run_module(tmp_path, "benchmarks.train_ab", args)
    rows = read(out)
    assert [(r["round"], r["variant"]) for r in rows] == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert all(CONTEXT - {"repeat"} | {"tokens_per_s", "seconds", "variants", "model"} <= set(r) for r in rows)
    assert rows[0]["variants"] == {"a": ["parallel.accumulate=unsharded"], "b": ["parallel.accumulate=sharded"]}
    assert {(r["steps"], r["timed_steps"], r["block_calls_per_step"], r["dtype"]) for r in rows} == {
        (4, 2, 1, "bfloat16")
    }
    for r in rows:  # the trainer's figure over the timed steps, and a step's share per block call
        assert r["seconds"] == pytest.approx(2 * r["tokens_per_step"] / r["tokens_per_s"])
        assert r["step_ms_per_block_call"] == pytest.approx(1e3 * r["seconds"] / 2)
    ratios = [rows[i + 1]["tokens_per_s"] / rows[i]["tokens_per_s"] for i in (0, 2)]
    assert f"b / a tokens/s within each pair: median {statistics.median(ratios):.3f}" in done.stdout

    table = TABLES["fsdp-units"](tmp_path)
    assert table_row(table, "a: `parallel.accumulate=unsharded`")[1:] == [
        spread_of([r["step_ms_per_block_call"] for r in rows[::2]], ".3f"),
        spread_of([r["tokens_per_s"] for r in rows[::2]], ",.0f"),
        "1.000",
    ]
    assert table_row(table, "b: `parallel.accumulate=sharded`")[-1] == spread_of(ratios, ".3f")
    assert "2 alternating pairs of rounds" in table and "over its last 2 of 4 steps" in table
    assert rows[0]["compiled"] == {"a": False, "b": False} and "bfloat16 on cpu, eager, torch threads 1" in table


@pytest.mark.slow
def test_launch_ab_rows_their_pairs_and_their_table(tmp_path, capsys):
    """The whole command per round, two steps of the smoke recipe: wall and machine CPU seconds per round, and the
    table's cells and within-pair ratios from them."""
    from benchmarks import launch_ab

    out = tmp_path / SMOKE_WORKERS
    argv = ["--a", "model.n_layers=1", "--b", "model.n_layers=2", "--rounds", "1", "--out", str(out)]
    argv += ["--config", str(REPO / "recipes" / "smoke.yaml"), "train.max_steps=2", "data.num_workers=0"]
    assert launch_ab.main(argv) == 0
    rows = read(out)
    assert [(r["round"], r["variant"]) for r in rows] == [(0, "a"), (0, "b")]
    assert all(
        CONTEXT - {"repeat", "bench"} | {"wall_s", "busy_cpu_s", "variants", "overrides"} <= set(r) for r in rows
    )
    assert rows[0]["variants"] == {"a": ["model.n_layers=1"], "b": ["model.n_layers=2"]}
    assert rows[0]["overrides"] == ["train.max_steps=2", "data.num_workers=0"]
    assert all(r["wall_s"] > 0 and r["busy_cpu_s"] > 0 for r in rows)
    table = TABLES["smoke-workers"](tmp_path)
    a, b = rows
    assert table_row(table, "a: `model.n_layers=1`")[1:] == [
        f"{a['wall_s']:.1f}",
        "1.00",
        f"{a['busy_cpu_s']:.1f}",
        "1.00",
    ]
    assert table_row(table, "b: `model.n_layers=2`")[1:] == [
        f"{b['wall_s']:.1f}",
        f"{b['wall_s'] / a['wall_s']:.2f}",
        f"{b['busy_cpu_s']:.1f}",
        f"{b['busy_cpu_s'] / a['busy_cpu_s']:.2f}",
    ]
    assert "1 alternating pair of rounds of `ladder-train --config " in table


def test_launch_ab_refuses_a_missing_config_before_running(tmp_path, capsys):
    from benchmarks import launch_ab

    with pytest.raises(SystemExit) as exited:
        launch_ab.main(["--a", "x=1", "--b", "x=2", "--config", str(tmp_path / "nope.yaml")])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"launch_ab: error: --config {tmp_path / 'nope.yaml'}: no such file\n"


@pytest.mark.slow
# inductor's CPU code generation imports a torch.jit decorator that torch 2.13 deprecates: nothing here to act on
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_loss_ab_rows_their_pairs_and_their_table(tmp_path, capsys):
    """The loss eager against compiled (inductor on the CPU) at a tiny shape: alternating rows that agree on the
    loss, the CPU times that make up each round, and the table's cells from them."""
    from benchmarks import loss_ab

    out = tmp_path / COMPILED_LOSS
    loss_ab.main(
        ["--tokens", "512", "--dim", "8", "--vocab", "4096", "--rounds", "2", "--calls", "2", "--out", str(out)]
    )
    rows = read(out)
    assert [(r["round"], r["variant"]) for r in rows] == [(0, "eager"), (0, "compiled"), (1, "eager"), (1, "compiled")]
    assert all(CONTEXT - {"repeat"} <= set(r) and r["calls"] == 2 and r["dtype"] == "bfloat16" for r in rows)
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=1e-4) and rows[0]["loss"] > 0
    ratios = [rows[i]["seconds_per_call"] / rows[i + 1]["seconds_per_call"] for i in (0, 2)]
    assert f"eager / compiled within each pair: median {statistics.median(ratios):.3f}" in capsys.readouterr().out

    table = TABLES["compiled-loss"](tmp_path)
    user = [rows[i]["user_s_per_call"] / rows[i + 1]["user_s_per_call"] for i in (0, 2)]
    assert table_row(table, "eager")[1:] == [
        spread_of([1e3 * r[f] for r in rows[::2]], ".0f") for f in bench_tables.LOSS_TIME_FIELDS
    ] + [spread_of(ratios, ".2f"), spread_of(user, ".2f")]
    assert table_row(table, "compiled")[-2:] == ["1.00", "1.00"]
    assert "2 alternating pairs of rounds of 2 forward and backward calls" in table
    assert "(512 tokens, dim 8, vocab 4,096: 2,097,152 logits; bfloat16, torch threads 1)" in table
    faults = [statistics.median(r["page_faults_per_call"] for r in rows[i::2]) for i in (0, 1)]
    assert f"(per call, eager {faults[0]:,.0f}, compiled {faults[1]:,.0f})" in table


def test_the_trainer_ab_table_says_which_variants_were_compiled():
    rows = [{"compiled": flags} for flags in ({"a": True, "b": False}, {"a": True, "b": False})]
    assert bench_tables._compiled(rows) == "compiled: a"
    assert bench_tables._compiled([{"compiled": {"a": True, "b": True}}]) == "compiled"
    assert bench_tables._compiled([{"compiled": {"a": False, "b": False}}]) == "eager"


def test_the_compiled_loss_table_of_gpu_rows_shows_the_peak_per_logit():
    """Rows as ``--device cuda`` writes them (peak bytes above the inputs): the table gives each variant's peak per
    logit and no CPU times."""
    host = {"cpu_model": "x", "cpu_count": 16, "torch_threads": 16, "gpu": "NVIDIA H200", "versions": {"torch": "2.11"}}
    context = {"invocation": "i", "command": "python -m benchmarks.loss_ab --device cuda", "date": "2026-11-29"}
    context |= {"host": host, "device": "cuda", "tokens": 1024, "dim": 64, "vocab": 2048, "calls": 5}
    context["dtype"] = "bfloat16"
    rows = [
        {**context, "round": p, "variant": v, "seconds_per_call": t, "peak_bytes_over_inputs": peak}
        for p, (eager, compiled) in enumerate([(0.004, 0.002), (0.006, 0.002)])
        for v, t, peak in (("eager", eager, 12 * 1024 * 2048), ("compiled", compiled, 2 * 1024 * 2048 + 2**20))
    ]
    table = bench_tables.compiled_loss(rows, "docs/results/gpu/x.jsonl")
    assert table_row(table, "eager")[1:] == ["5.00 (4.00–6.00)", "24", "12.00", "2.50 (2.00–3.00)"]
    assert table_row(table, "compiled")[1:] == ["2.00", "5", "2.50", "1.00"]
    assert "(1,024 tokens, dim 64, vocab 2,048: 2,097,152 logits; bfloat16) on NVIDIA H200" in table
    assert "user CPU" not in table


def test_train_ab_refuses_a_round_too_short_to_time_and_a_bad_key_before_training(capsys, monkeypatch):
    from benchmarks import train_ab

    monkeypatch.setattr(train_ab, "init_distributed", lambda: pytest.fail("a trainer was started"))
    with pytest.raises(SystemExit):
        train_ab.main(["--steps", "3", "--a", "parallel.accumulate=sharded", "--b", "parallel.accumulate=unsharded"])
    assert "--steps 3: a round times its second half, so it needs at least 4 steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        train_ab.main(["--a", "parallel.accumulate=sharded", "--b", "parallel.accumulate=rust"])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().endswith(
        "error: key 'parallel.accumulate' must be one of auto, unsharded, sharded, got 'rust'"
    )
    with pytest.raises(SystemExit):  # two variants to compare, named: there is no default pair
        train_ab.main(["--a", "parallel.accumulate=sharded"])
    assert "the following arguments are required: --b" in capsys.readouterr().err
