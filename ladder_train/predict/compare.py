"""``ladder-predict --compare FILE.jsonl``: the performance model's prediction of every measured row beside its
measurement, and the relative errors. The rows are ladder-bench's or benchmarks/gpu_check.py's ``decode`` rows
(``rows.py``); each is predicted on the profile of its card (``rows.profile_for``) unless ``--gpu`` names one."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from ..bench_schema import WHERE
from ..errors import InputError
from ..model import PAPER_LAYOUTS
from ..option_errors import desync_every
from .hardware import Device
from .perfmodel import Emulated, predict_rows
from .rows import decode_rows, profile_for
from .shapes import shape_from_fields


def bench_rows(path: str | Path) -> list[dict]:
    """The rows of ``path`` the predictor can predict (``rows.decode_rows``): ladder-bench's, and gpu_check's
    decode rows made ladder-bench rows."""
    return decode_rows(path)


def rows_by_profile(rows: list[dict], devices: dict[str, Device], gpu: str | None = None) -> dict[str, list[dict]]:
    """The rows each profile predicts: ``gpu`` all of them, else each row its card's (``rows.profile_for``)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        name = gpu or profile_for(row, devices)
        if name not in devices:
            raise InputError(f"--gpu {name!r}: no such profile (have {', '.join(devices)})")
        groups.setdefault(name, []).append(row)
    return groups


def _rel(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else pred / meas - 1


def _setting(row: dict, shape, device, link: str | None) -> tuple[tuple, tuple]:
    """What a row's prediction depends on (a key: rows of one key are predicted together) and the device, link and
    emulated link it is predicted on: ``device`` compiled as the row ran, ``link`` or the profile's gloo (else its
    first), the emulated link where the row had one."""
    x = row.get("emulated_link_latency_ms") or 0.0
    bw = row.get("link_bandwidth_gbs")
    emulated = Emulated(x / 1e3, bw * 1e9 if bw else None) if x or bw else None
    link_name = link or ("gloo" if "gloo" in device.links else next(iter(device.links)))
    # a compiled run fuses kernels and reads the whole static cache, as the profile's `compiled` says
    dev = dataclasses.replace(device, compiled=bool(row.get("compiled", device.compiled)))
    key = (shape.key, dev.compiled, row["tp"], row["batch"], row["prompt_len"], row["gen_len"], emulated)
    return key, (dev, link_name, emulated)


def _result(row: dict, shape: str, pred: dict, pred_none: dict) -> dict:
    """One row's prediction beside its measurement: decode step, prefill, speedup and no-communication step."""
    meas_sp = row.get("decode_speedup_vs_standard")
    result = {
        "shape": shape,
        "layout": row["layout"],
        "batch": row["batch"],
        "x_ms": row.get("emulated_link_latency_ms") or 0.0,
        "pred_decode_ms": pred["decode_ms_per_token"],
        "meas_decode_ms": row["decode_ms_per_token"],
        "pred_prefill_ms": pred["prefill_ms"],
        "meas_prefill_ms": row.get("prefill_ms"),
        "pred_speedup": pred["decode_speedup_vs_standard"],
        "meas_speedup": meas_sp,
        "pred_none_ms": pred_none["decode_ms_per_token"],
        "meas_none_ms": (row.get("none") or {}).get("decode_ms_per_token"),
    }
    result["decode_err"] = _rel(result["pred_decode_ms"], result["meas_decode_ms"])
    result["prefill_err"] = _rel(result["pred_prefill_ms"], result["meas_prefill_ms"])
    result["speedup_err"] = _rel(result["pred_speedup"], meas_sp) if row["layout"] != "standard" else None
    result["none_err"] = _rel(result["pred_none_ms"], result["meas_none_ms"])
    return result


def compare_with_bench(bench: list[dict], device, link: str | None = None) -> tuple[list[dict], dict]:
    """Predict each bench row on ``device`` (its link unless ``link``; emulated where the row was) and the
    relative errors pred / measured - 1. Returns the per-row results and the mean absolute errors."""
    cache: dict[tuple, dict] = {}
    out = []
    # every row's shape and layout is checked before any prediction
    shapes = [
        shape_from_fields(r.get("shape") or r.get("model", "bench"), r["model_args"], True, r[WHERE]) for r in bench
    ]
    for row in bench:
        if row["layout"] not in (*PAPER_LAYOUTS, "desync") and desync_every(row["layout"]) is None:
            known = ", ".join(PAPER_LAYOUTS)
            raise InputError(f"{row[WHERE]}: layout {row['layout']!r} is not one of {known}, desync or desync-K")
    settings = [_setting(row, shape, device, link) for row, shape in zip(bench, shapes, strict=True)]
    layouts: dict[tuple, set] = {}  # per setting, every layout its rows ask for: predicted together
    for row, (key, _) in zip(bench, settings, strict=True):
        layouts.setdefault(key, set()).add(row["layout"])
    for row, shape, (key, (dev, link_name, emulated)) in zip(bench, shapes, settings, strict=True):
        if key not in cache:
            preds = predict_rows(
                shape,
                dev,
                link_name,
                row["tp"],
                [row["batch"]],
                row["prompt_len"],
                row["gen_len"],
                emulated,
                tuple(sorted(layouts[key])),
            )
            cache[key] = {r["layout"]: r for r in preds}
        out.append(_result(row, shape.name, cache[key][row["layout"]], cache[key]["none"]))

    def mae(key):
        errs = [abs(r[key]) for r in out if r[key] is not None]
        return statistics.fmean(errs) if errs else None

    return out, {key: mae(f"{key}_err") for key in ("decode", "prefill", "speedup", "none")}


def print_compare(results: list[dict], summary: dict, path: str, device_name: str):
    def pct(v):
        return f"{v:+.1%}" if v is not None else "-"

    def num(v, spec):
        return format(v, spec) if v is not None else "-"

    print(f"\nladder-predict --compare {path}: PREDICTED ({device_name} profile) vs MEASURED")
    head = (
        f"{'shape':<24}{'layout':<9}{'batch':>6}{'X ms':>6} | {'decode ms/tok pred':>18}{'meas':>9}{'err':>8} |"
        f" {'prefill ms pred':>15}{'meas':>9}{'err':>8} |"
        f" {'speedup pred':>12}{'meas':>7}{'err':>8} | {'no-comm pred':>12}{'meas':>9}{'err':>8}"
    )
    print(head + "\n" + "-" * len(head))
    for r in results:
        print(
            f"{r['shape'][-23:]:<24}{r['layout']:<9}{r['batch']:>6}{r['x_ms']:>6g} | {r['pred_decode_ms']:>18.3f}"
            f"{r['meas_decode_ms']:>9.3f}{pct(r['decode_err']):>8} | {r['pred_prefill_ms']:>15.3f}"
            f"{num(r['meas_prefill_ms'], '.3f'):>9}{pct(r['prefill_err']):>8} | {r['pred_speedup']:>11.2f}x"
            f"{num(r['meas_speedup'], '6.2f'):>6}x{pct(r['speedup_err']):>8} | {r['pred_none_ms']:>12.3f}"
            f"{num(r['meas_none_ms'], '.3f'):>9}{pct(r['none_err']):>8}"
        )
    names = {"decode": "decode ms/tok", "prefill": "prefill ms", "speedup": "decode speedup (non-standard rows)"}
    names["none"] = "no-comm ms/tok"
    parts = [f"{names[k]} " + (f"{v:.1%}" if v is not None else "-") for k, v in summary.items()]
    print("mean absolute error: " + ", ".join(parts))
