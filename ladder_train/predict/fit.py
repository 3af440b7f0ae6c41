"""``ladder-predict fit``: a GPU profile's free constants fitted to one card's measured rows and checked on another
card's, both ways. Every predicted figure is a PREDICTION.

The constants a profile sets by hand (``CONSTANTS``): ``compute_eff``, ``mem_eff`` and ``kernel_us``. A card's rows
are its decode rows (benchmarks/gpu_check.py's ``decode`` rows, or ladder-bench's run on the card: ``rows.py``) of
the ``standard`` layout, each two points: its TPOT and its prefill. The fit: least squares of the relative errors,
predicted / measured - 1, over the free constants within ``BOUNDS`` (scipy's ``least_squares`` from the profile's own
values and a few fixed starts; deterministic); every other constant of the profile is kept, and the prediction is ``compare.py``'s.

What ``card_check`` fits (``FREE``): ``compute_eff`` and ``kernel_us``. ``mem_eff`` is not fitted: it is the card's
copy rate as measured beside the rows (the file's ``ceilings`` row) over the datasheet bandwidth, a measurement of
that card, so constants fitted on one card are checked on another with that card's own. Where a card has as many
points as free constants, its fit meets them exactly and its in-sample error is zero by construction.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..bench_schema import WHERE
from ..errors import InputError
from .compare import rows_by_profile
from .hardware import Device
from .perfmodel import predict_generation
from .rows import copy_efficiency, read_rows
from .shapes import shape_from_fields

PROG = "ladder-predict fit"
CONSTANTS = ("compute_eff", "mem_eff", "kernel_us")
FREE = ("compute_eff", "kernel_us")
BOUNDS = {"compute_eff": (0.01, 1.0), "mem_eff": (0.01, 1.0), "kernel_us": (0.0, 100.0)}
# the search starts from the profile's values and from every corner of these (deterministic)
STARTS = {"compute_eff": (0.3, 0.8), "mem_eff": (0.3, 0.8), "kernel_us": (0.5, 4.0)}
QUANTITIES = (("decode", "TPOT"), ("prefill", "prefill"))


@dataclass(frozen=True)
class CardRows:
    """One card's rows: the profile that predicts them (as shipped), the rows, the files and the card's measured copy
    rate over the profile's datasheet bandwidth (None without a ``ceilings`` row)."""

    profile: str
    device: Device
    rows: list[dict]
    files: tuple[str, ...]
    copy_eff: float | None
    shapes: tuple = ()  # each row's Shape, as compare.py reads it

    @property
    def points(self) -> int:
        return sum(row.get(key) is not None for row in self.rows for key in ("decode_ms_per_token", "prefill_ms"))


def load_card(files: list, devices: dict[str, Device], gpu: str | None = None, layouts=("standard",)) -> CardRows:
    """The rows of ``layouts`` in ``files`` (one card's: its profile is ``gpu`` or the rows' card's)."""
    rows, ceilings = [], []
    for path in files:
        decode, ceil = read_rows(path)
        rows += [row for row in decode if row["layout"] in layouts]
        ceilings += ceil
    if not rows:
        raise InputError(f"{', '.join(map(str, files))}: no decode rows of layout {', '.join(layouts)} to fit")
    emulated = [r for r in rows if r.get("emulated_link_latency_ms") or r.get("link_bandwidth_gbs")]
    if emulated:
        raise InputError(f"{emulated[0][WHERE]}: a row over ladder-bench's emulated link is not a card's own to fit")
    profiles = rows_by_profile(rows, devices, gpu)
    if len(profiles) > 1:
        raise InputError(f"{', '.join(map(str, files))}: rows of more than one card ({', '.join(profiles)})")
    name = next(iter(profiles))
    shapes = tuple(shape_from_fields(r.get("shape") or r["model"], r["model_args"], True, r[WHERE]) for r in rows)
    return CardRows(name, devices[name], rows, tuple(map(str, files)), copy_efficiency(ceilings, devices[name]), shapes)


def values_of(device: Device) -> dict[str, float]:
    return {"compute_eff": device.compute_eff, "mem_eff": device.mem_eff, "kernel_us": device.kernel_s * 1e6}


def with_values(device: Device, values: dict[str, float]) -> Device:
    return dataclasses.replace(
        device, compute_eff=values["compute_eff"], mem_eff=values["mem_eff"], kernel_s=values["kernel_us"] * 1e-6
    )


def base_values(card: CardRows, free=FREE) -> dict[str, float]:
    """The profile's constants, ``mem_eff`` the card's measured copy efficiency where it is not free and measured."""
    values = values_of(card.device)
    if "mem_eff" not in free and card.copy_eff is not None:
        values["mem_eff"] = min(card.copy_eff, 1.0)
    return values


def predicted(card: CardRows, values: dict[str, float]) -> list[dict]:
    """Each row predicted on the card's profile with ``values``, as ``compare.compare_with_bench`` predicts it (its
    layout on the profile's gloo link, else its first; compiled as the row ran), beside its measurement: ``pred_decode_ms``,
    ``meas_decode_ms``, ``decode_err``, and the same of ``prefill``."""
    device = with_values(card.device, values)
    link = device.links["gloo" if "gloo" in device.links else next(iter(device.links))]
    out = []
    for row, shape in zip(card.rows, card.shapes, strict=True):
        dev = dataclasses.replace(device, compiled=bool(row.get("compiled", device.compiled)))
        p = predict_generation(
            shape, dev, link, row["tp"], row["layout"], row["batch"], row["prompt_len"], row["gen_len"]
        )
        r = {"pred_decode_ms": p["decode_ms_per_token"], "meas_decode_ms": row["decode_ms_per_token"]}
        r.update(pred_prefill_ms=p["prefill_ms"], meas_prefill_ms=row.get("prefill_ms"))
        for key, _ in QUANTITIES:
            measured = r[f"meas_{key}_ms"]
            r[f"{key}_err"] = r[f"pred_{key}_ms"] / measured - 1 if measured else None
        out.append(r)
    return out


def point_errors(results: list[dict]) -> list[float]:
    """predicted / measured - 1 of every point: each row's TPOT, then its prefill where measured."""
    return [r[f"{key}_err"] for r in results for key, _ in QUANTITIES if r[f"{key}_err"] is not None]


def fit(card: CardRows, free=FREE) -> dict[str, float]:
    """The constants ``free`` that minimise the sum of squared relative errors over the card's points, the others
    those of ``base_values``; fewer points than free constants is an InputError."""
    from scipy.optimize import least_squares

    unknown = [name for name in free if name not in CONSTANTS]
    if unknown or not free:
        raise InputError(f"free constants must be some of {', '.join(CONSTANTS)}, got {', '.join(free) or 'none'}")
    if card.points < len(free):
        raise InputError(f"{card.profile}: {card.points} point(s) cannot fit {len(free)} constants")
    start = base_values(card, free)
    low, high = zip(*(BOUNDS[name] for name in free), strict=True)
    starts = [[min(max(start[name], lo), hi) for name, lo, hi in zip(free, low, high, strict=True)]]
    starts += [list(corner) for corner in itertools.product(*(STARTS[name] for name in free))]

    def residuals(x):
        return point_errors(predicted(card, {**start, **dict(zip(free, x, strict=True))}))

    scale = [1.0 if name == "kernel_us" else 0.1 for name in free]
    best = None
    for x0 in starts:  # the roofline's max() has kinks where a search can stall: the best of a few starts
        solution = least_squares(residuals, x0, bounds=(low, high), x_scale=scale, ftol=1e-12, xtol=1e-12, gtol=1e-12)
        if best is None or solution.cost < best.cost * (1 - 1e-9):
            best = solution
    return {**start, **{name: float(v) for name, v in zip(free, best.x, strict=True)}}


def _label(row: dict, profile: str) -> str:
    layers = row["model_args"]["n_layers"]
    tuned = ", GEMV tuning" if row.get("gemv_tuning") else ""
    return f"{profile}, {layers} layers{tuned} ({Path(row[WHERE].rsplit(':', 1)[0]).name})"


def _points(card: CardRows, values: dict, sample: str) -> list[dict]:
    """Each row of ``card`` predicted with ``values``: the constants, and per quantity measured, predicted, error."""
    out = []
    for row, r in zip(card.rows, predicted(card, values), strict=True):
        record = {"row": _label(row, card.profile), "sample": sample, "values": dict(values)}
        for key, quantity in QUANTITIES:
            record[quantity] = {"measured_ms": r[f"meas_{key}_ms"], "predicted_ms": r[f"pred_{key}_ms"]}
            record[quantity]["error"] = r[f"{key}_err"]
        out.append(record)
    return out


def _errors(points: list[dict], sample: str) -> list[float]:
    return [p[q]["error"] for p in points if p["sample"] == sample for _, q in QUANTITIES if p[q]["error"] is not None]


def cross_check(train: CardRows, test: CardRows, free=FREE) -> dict:
    """Fit ``free`` on ``train``'s points and predict ``test``'s with them, its other constants its own
    (``base_values``); too few points for ``free`` gives a record with ``error`` instead."""
    record = {"free": list(free), "fitted_on": train.profile, "checked_on": test.profile}
    record["points"] = {"in": train.points, "out": test.points}
    if train.points < len(free):
        return {**record, "error": f"{train.points} points cannot fit {len(free)} constants"}
    fitted = fit(train, free)
    moved = {**base_values(test, free), **{name: fitted[name] for name in free}}
    points = _points(train, fitted, "in") + _points(test, moved, "out")
    errors = {sample: _errors(points, sample) for sample in ("in", "out")}
    record.update(fitted=fitted, predictions=points)
    record["mean_abs_error"] = {sample: statistics.fmean(map(abs, e)) for sample, e in errors.items()}
    return record


def card_check(files_a: list, files_b: list, devices: dict[str, Device], free_sets=(FREE, CONSTANTS)) -> dict:
    """For each set of free constants: fitted on card A's rows and checked on card B's, and the reverse
    (``cross_check``); beside them each card's rows predicted by its profile as shipped."""
    cards = [load_card(files_a, devices), load_card(files_b, devices)]
    if cards[0].profile == cards[1].profile:  # its rows would stand as out of sample, keyed by one profile
        raise InputError(
            f"--check {', '.join(map(str, files_b))}: rows of {cards[1].profile}, the card the fit is made on: the "
            "check is out of sample only on another card's rows"
        )
    return {
        "what": "ladder-predict's free constants fitted on one card's decode rows and checked on the other's; "
        "measured = the rows' figures, every other figure PREDICTED",
        "cards": {
            c.profile: {
                "files": list(c.files),
                "rows": len(c.rows),
                "points": c.points,
                "copy_eff": c.copy_eff,
                "profile_mem_eff": c.device.mem_eff,
            }
            for c in cards
        },
        "shipped": [p for c in cards for p in _points(c, values_of(c.device), "shipped")],
        "fits": [cross_check(a, b, free) for free in free_sets for a, b in (cards, cards[::-1])],
    }


HEADER = ["free constants", "fitted on", "predicted row", "sample", "compute_eff", "mem_eff", "kernel_us"]
HEADER += ["TPOT ms: measured → predicted", "error", "prefill ms: measured → predicted", "error"]
SAMPLES = {"in": "in", "out": "out of sample", "shipped": "not fitted to rows"}


def _free_label(free: list[str], cards: dict) -> str:
    """The free constants, and where each card's ``mem_eff`` comes from when it is not one of them: the card's copy
    rate measured beside its rows (a ``ceilings`` row) over the datasheet bandwidth, else the profile's own value."""
    label = ", ".join(f"`{name}`" for name in free)
    if "mem_eff" in free:
        return label
    if all(card["copy_eff"] is not None for card in cards.values()):
        return f"{label} (`mem_eff`: the card's copy rate / datasheet)"
    sources = [
        f"{name}'s measured copy rate / datasheet"
        if card["copy_eff"] is not None
        else f"{name}'s profile value {card['profile_mem_eff']:g}, no copy rate measured"
        for name, card in cards.items()
    ]
    return f"{label} (`mem_eff`: {'; '.join(sources)})"


def _cells(point: dict) -> list[str]:
    values = point["values"]
    cells = [point["row"], SAMPLES[point["sample"]], f"{values['compute_eff']:.3f}", f"{values['mem_eff']:.3f}"]
    cells.append(f"{values['kernel_us']:.2f}")
    for _, quantity in QUANTITIES:
        q = point[quantity]
        if q["error"] is None:
            cells += ["—", "—"]
        else:
            cells += [f"{q['measured_ms']:.3f} → {q['predicted_ms']:.3f}", f"{100 * q['error']:+.1f} %"]
    return cells


def table_rows(result: dict) -> list[list[str]]:
    """The table's lines: each card's rows on its shipped profile, then each fit's in-sample and out-of-sample rows."""
    cards = result["cards"]
    lines = []
    for i, point in enumerate(result["shipped"]):
        lines.append(["none: the shipped profiles, set by hand" if i == 0 else "", ""] + _cells(point))
    for fit_record in result["fits"]:
        card = cards[fit_record["fitted_on"]]
        rows = f"{card['rows']} row" + ("s" if card["rows"] != 1 else "")
        on = f"{fit_record['fitted_on']}: {rows}, {card['points']} points"
        if "error" in fit_record:
            lines.append([_free_label(fit_record["free"], cards), on, f"not fitted: {fit_record['error']}"] + [""] * 8)
            continue
        for i, point in enumerate(fit_record["predictions"]):
            lines.append([_free_label(fit_record["free"], cards), on] if i == 0 else ["", ""])
            lines[-1] += _cells(point)
    return lines


def note(result: dict) -> str:
    """What the table says in words: the points and constants of each fit and its out-of-sample error."""
    parts = []
    for f in result["fits"]:
        n, k = f["points"]["in"], len(f["free"])
        head = f"{', '.join(f['free'])} fitted on {f['fitted_on']} ({n} points, {k} constants)"
        if "error" in f:
            parts.append(f"{head}: not possible")
        elif n == k:
            out = 100 * f["mean_abs_error"]["out"]
            parts.append(
                f"{head}: in-sample error zero by construction; out of sample on {f['checked_on']} {out:.1f} %"
            )
        else:
            e = {s: 100 * v for s, v in f["mean_abs_error"].items()}
            parts.append(f"{head}: in sample {e['in']:.1f} %, out of sample on {f['checked_on']} {e['out']:.1f} %")
        parts[-1] += "".join(
            f" ({name} at its {side} bound, {BOUNDS[name][i]:g})"
            for name in f["free"]
            for i, side in enumerate(("lower", "upper"))
            if "fitted" in f and abs(f["fitted"][name] - BOUNDS[name][i]) < 1e-6
        )
    return (
        "Predicted, except the measured figures (the rows' TPOT and prefill). Error = predicted / measured - 1; "
        "mean absolute errors over TPOT and prefill: " + "; ".join(parts) + "."
    )


def markdown(result: dict) -> str:
    """The table and its note, as docs/benchmarks.md shows them."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    return "\n".join(lines) + "\n\n" + note(result)
