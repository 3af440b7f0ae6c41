"""The docs' tables of tensor-parallel generation, made from ladder-bench's JSON lines under ``docs/results/`` (each
table's file: ``manifest.toml``): several invocations of one command append to one file, and each table shows per case
the median over the invocations with the lowest and highest in brackets.

An invocation's rows are one sample: its speedups, communication share and overlap efficiency were derived within it
(``ladder_train/bench/results.py``: ``derive``), side by side, before any median. How rows are told apart by
invocation: ``ladder_train/report/tp_invocations.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from ladder_train.bench import latency_note
from ladder_train.bench_schema import read_bench
from ladder_train.predict import bench_rows, compare_with_bench, load_profiles
from ladder_train.report import link_sweep
from ladder_train.report.tables import markdown_table
from ladder_train.report.tp_bench import spread_notes
from ladder_train.report.tp_invocations import cell, invocations, joined_values, machines, runs_note, samples


def _percent(key: str) -> Callable[[dict, dict], float | None]:
    return lambda row, _: None if row.get(key) is None else 100 * row[key]


def _none_ms(row: dict, _standard: dict) -> float | None:
    return (row.get("none") or {}).get("decode_ms_per_token")


def _predicted(row: dict, standard: dict) -> float | None:
    x = row.get("emulated_link_latency_ms") or 0.0
    return link_sweep.predicted_decode_ms(standard, x) / link_sweep.predicted_decode_ms(row, x)


def _x_over(unit: Callable[[dict], float]) -> Callable[[dict, dict], float]:
    return lambda row, standard: (row.get("emulated_link_latency_ms") or 0.0) / unit(standard)


def _shorter_module(row: dict) -> float:
    return min(row["module_ms"].values())


SPEEDUPS = [
    ("end-to-end speedup", lambda r, _: r.get("speedup_vs_standard"), ".2f", "×"),
    ("decode speedup", lambda r, _: r.get("decode_speedup_vs_standard"), ".2f", "×"),
]
EFFICIENCY = [
    ("overlap efficiency", _percent("overlap_efficiency"), ".0f", " %"),
    ("t(none) decode ms/token", _none_ms, ".1f", ""),
]


# what the columns of the tables with speedups, t(none) and an overlap efficiency mean (after runs_note)
DEFINITIONS = (
    "Speedups are over standard within each invocation; t(none) is the row's decode ms/token with every all-reduce "
    "skipped, and the overlap efficiency (the ladder's) = (t(standard) - t) / min(t(standard) - t(none, standard), "
    "t(none, standard))."
)


def tp_generation(rows: list[dict], path: str) -> str:
    """docs/results.md's TP table: per layout and batch size tokens/s, decode time, speedups, the ceiling, the
    communication share and the overlap efficiency with t(none)."""
    header, body, cases = ["layout", "batch"], [], samples(rows)
    settings = list(dict.fromkeys((key[1], key[4]) for key in cases))
    if len(settings) > 1:
        header.insert(0, "shape, X")
    header += [
        "tokens/s",
        "decode ms/token",
        "speedup vs standard (end-to-end)",
        "decode speedup vs standard",
        "ceiling tokens/s",
        "comm share",
        "overlap efficiency",
        "t(none) decode ms/token",
    ]
    for key, pairs in cases.items():
        line = [
            key[2],
            str(key[3]),
            cell(pairs, lambda r, _: r["tokens_per_s"], ",.1f"),
            cell(pairs, lambda r, _: r["decode_ms_per_token"], ".2f"),
            cell(pairs, lambda r, _: r.get("speedup_vs_standard"), ".3f", "×"),
            cell(pairs, lambda r, _: r.get("decode_speedup_vs_standard"), ".3f", "×"),
            cell(pairs, lambda r, _: (r.get("none") or {}).get("tokens_per_s"), ",.1f"),
            cell(pairs, _percent("comm_share"), ".1f", " %"),
            *(cell(pairs, figure, spec, suffix) for _, figure, spec, suffix in EFFICIENCY),
        ]
        body.append(([f"{key[1]}, X {key[4]:g} ms"] if len(settings) > 1 else []) + line)
    notes = [f"{runs_note(rows, path)} {DEFINITIONS}"]
    if len(settings) == 1:
        notes += _setting_notes(cases)
    return markdown_table(header, body) + "\n\n" + "\n\n".join(notes) + "\n"


def _setting_notes(cases: dict[tuple, list[tuple[dict, dict]]]) -> list[str]:
    """The emulated link against the module times (medians over the invocations), and where a layout's tokens/s
    over the invocations overlaps standard's (``report/tp_bench.py``'s note, the invocations as its runs)."""
    notes = []
    standard = [row for key, pairs in cases.items() if key[2] == "standard" for row, _ in pairs]
    x = standard[0].get("emulated_link_latency_ms") if standard else None
    if x and all("module_ms" in row for row in standard):
        modules = {name: statistics.median(row["module_ms"][name] for row in standard) for name in ("attention", "mlp")}
        notes.append(latency_note(x, modules) + " (module times: medians over the invocations).")
    merged = [
        {"layout": key[2], "batch": key[3], "tokens_per_s_runs": {"samples": [row["tokens_per_s"] for row, _ in pairs]}}
        for key, pairs in cases.items()
    ]
    within = spread_notes(merged)
    if within:
        notes.append(within[0].replace("over the timed runs", "over the invocations").replace(", the error bars", ""))
    return notes


def link_table(
    rows: list[dict], path: str, predicted: bool, shape_column: bool, unit: Callable[[dict], float], unit_name: str
) -> str:
    """Per link latency X (and shape) and layout: decode time, speedups, [the predicted decode speedup], the overlap
    efficiency with t(none)."""
    header = (["shape"] if shape_column else []) + ["X (ms)", f"X / {unit_name}", "layout", "decode ms/token"]
    header += [name for name, *_ in SPEEDUPS] + (["predicted decode speedup"] if predicted else [])
    header += [name for name, *_ in EFFICIENCY]
    body = []
    for key, pairs in samples(rows).items():
        args = pairs[0][0]["model_args"]
        shape = [f"hidden {args['dim']}, {args['n_layers']} layers, batch {key[3]}"] if shape_column else []
        x = f"{key[4]:g}" if key[4] else "0 (real gloo)"
        line = shape + [
            x,
            cell(pairs, _x_over(unit), ".2f"),
            key[2],
            cell(pairs, lambda r, _: r["decode_ms_per_token"], ".1f"),
        ]
        line += [cell(pairs, figure, spec, suffix) for _, figure, spec, suffix in SPEEDUPS]
        line += [cell(pairs, _predicted, ".2f", "×")] if predicted else []
        line += [cell(pairs, figure, spec, suffix) for _, figure, spec, suffix in EFFICIENCY]
        body.append(line)
    note = f"{runs_note(rows, path)} {DEFINITIONS}"
    if predicted:
        note += (
            " *Predicted*: the serialised-link timeline (`report/link_sweep.py`) fed with each invocation's "
            "measured module times and an ideal link of exactly X per all-reduce (no gloo cost)."
        )
    return markdown_table(header, body) + "\n\n" + note + "\n"


def link_sweep_table(rows: list[dict], path: str) -> str:
    """docs/benchmarks.md's link sweep: one shape at several emulated latencies X, beside the prediction."""
    return link_table(rows, path, True, False, link_sweep.module_ms, "module")


def overlap_checks(rows: list[dict], path: str) -> str:
    """docs/benchmarks.md's two overlap checks: two shapes, each at its own X, against the shorter module."""
    return link_table(rows, path, False, True, _shorter_module, "shorter module")


# per figure of a predicted row: its predicted, measured and error keys (compare_with_bench's) and its format
PREDICTED_FIGURES = (
    ("pred_decode_ms", "meas_decode_ms", "decode_err", ".1f"),
    ("pred_speedup", "meas_speedup", "speedup_err", ".2f"),
    ("pred_none_ms", "meas_none_ms", "none_err", ".1f"),
)
PREDICT_HEADER = ["shape", "layout", "batch", "X ms"] + [
    column
    for figure in ("decode ms/tok", "decode speedup", "no-comm ms/tok")
    for column in (f"{figure} predicted", "measured", "error")
]
# the mean absolute errors of compare_with_bench's summary, in words
SUMMARY_ERRORS = (
    ("decode time", "decode"),
    ("decode speedup (not standard)", "speedup"),
    ("no-communication time", "none"),
)


def predict_cpu(root: Path, folders: str) -> str:
    """docs/benchmarks.md's predictor on this CPU: each `ladder-predict validate` folder under ``folders`` has its
    ladder-bench rows predicted with the profile it calibrated; per case the medians over the folders."""
    found = sorted(p.parent for p in (root / folders).glob("*/bench.jsonl"))
    merged: dict[tuple, list[dict]] = {}
    summaries = []
    for folder in found:
        profile = load_profiles(folder / "cpu.yaml")["cpu"]
        results, summary = compare_with_bench(bench_rows(folder / "bench.jsonl"), profile)
        summaries.append(summary)
        for r in results:
            merged.setdefault((r["shape"], r["layout"], r["batch"], r["x_ms"]), []).append(r)
    body = [_predicted_line(key, [(r, None) for r in rows]) for key, rows in merged.items()]
    summary_pairs = [(s, None) for s in summaries]
    errors = ", ".join(
        f"{name} {cell(summary_pairs, lambda s, _, k=key: 100 * s[k], '.1f', ' %')}" for name, key in SUMMARY_ERRORS
    )
    rows = [row for folder in found for row in read_bench(folder / "bench.jsonl")]
    return (
        markdown_table(PREDICT_HEADER, body) + f"\n\nMean absolute errors: {errors}. Each folder's rows predicted "
        f"with the `cpu` profile it calibrated (`{folders}/*/cpu.yaml`); medians over {len(found)} folder{'s' * (len(found) != 1)} "
        "(lowest–highest in brackets). Measured speedups are over standard within each invocation. "
        + runs_note(rows, folders)
        + "\n"
    )


def _predicted_line(key: tuple, pairs: list[tuple[dict, None]]) -> list[str]:
    """One case's row of the predictor table: its shape, layout, batch and X, then per figure the medians over the
    folders of the predicted and measured values and of the error."""
    shape, layout, batch, x = key
    line = [shape, layout, str(batch), f"{x:g}"]
    for predicted, measured, error, spec in PREDICTED_FIGURES:
        line += [
            cell(pairs, lambda r, _, k=predicted: r[k], spec),
            cell(pairs, lambda r, _, k=measured: r[k], spec),
            cell(pairs, lambda r, _, k=error: None if r[k] is None else 100 * r[k], "+.1f", " %"),
        ]
    return line


def tp_compiled(rows: list[dict], path: str) -> str:
    """docs/benchmarks.md's compiled path on the CPU: per invocation and layout what ran compiled and what it
    generated, and the compilations against the two graphs (prefill, decode) each model, communicator and batch size
    may have. Its timings (a model of 0.1-0.5 ms over a few decode steps) are dispatch noise and are left out."""
    header = [
        "invocation",
        "layout",
        "batch",
        "compiled",
        "backend",
        "new tokens per run",
        "timed runs",
        "compilations (invocation)",
        "allowed",
    ]
    body = []
    for number, group in enumerate(invocations(rows), 1):
        graphs = 2 * len(group) * (2 if any(r.get("none") for r in group) else 1)  # x {real, none} communicators
        for r in group:
            body.append(
                [
                    str(number),
                    r["layout"],
                    str(r["batch"]),
                    "yes" if r["compiled"] else "no",
                    r["compile_backend"] or "—",
                    str(r["gen_len"]),
                    str(r["runs"]),
                    str(r.get("compilations", "—")),
                    str(graphs),
                ]
            )
    return (
        markdown_table(header, body) + f"\n\nTP {joined_values(rows, 'tp')} over {joined_values(rows, 'backend')}, "
        f"{joined_values(rows, 'dtype')}, prompt {joined_values(rows, 'prompt_len')}; {joined_values(rows, 'warmup')} warm-up runs. "
        f"Allowed = 2 graphs (prefill, decode) per model, communicator (real, none) and batch size; ladder-bench "
        f"fails above it. Measured {joined_values(rows, 'date')} on {machines(rows)}, torch {joined_values(rows, 'torch')}; rows in "
        f"`{path}`.\n"
    )
