"""The measured rows ladder-predict reads (``--compare``, ``fit``): ladder-bench's rows (``--out``) and
``benchmarks/gpu_check.py``'s ``decode`` rows, the latter made ladder-bench rows (TPOT as ``decode_ms_per_token``,
the preset's fields with the row's layer count as ``model_args``, TP 1 as gpu_check runs it); and gpu_check's
``ceilings`` rows (the card's measured copy rate and bf16 matmul rate). A row names its card (``device``), and the
profile that predicts it is the first of the profiles whose ``card`` is that card (``profile_for``)."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from ..bench_schema import WHERE, check_fields, read_bench
from ..errors import InputError
from ..gpu_cards import card_for
from ..model import PRESETS
from .hardware import Device
from .shapes import resolve_shape

# the fields of a ladder-bench row (bench_schema.FIELDS) a prediction needs, beside model_args
BENCH_KEYS = ("layout", "batch", "prompt_len", "gen_len", "decode_ms_per_token", "tp")
# gpu_check's decode row (benchmarks/gpu_rows.py decode_row): what a prediction needs
DECODE_KEYS = ("layout", "model", "n_layers", "batch", "prompt_len", "gen_len", "tpot_ms")
# what a decode row's and a ceilings row's fields a prediction reads must be (bench_schema.check_fields)
DECODE_ROW = {key: "positive" for key in ("tpot_ms", "prefill_ms")}
DECODE_ROW |= {key: "count" for key in ("n_layers", "batch", "prompt_len", "gen_len", "tp")}
DECODE_ROW |= {key: "text" for key in ("model", "layout", "device", "dtype")} | {
    "compiled": "flag",
    "gemv_tuning": "flag",
}
CEILINGS_ROW = {"copy_tb_s_median": "positive"}
COPIED = ("layout", "batch", "prompt_len", "gen_len", "compiled", "prefill_ms", "device", "gemv_tuning", "dtype")


def from_decode_row(row: dict) -> dict:
    """gpu_check's ``decode`` row as a ladder-bench row (its shape: the preset ``model`` with ``n_layers``)."""
    missing = [key for key in DECODE_KEYS if row.get(key) is None]
    if missing:
        raise InputError(f"{row[WHERE]}: decode row without {missing[0]!r} (not a gpu_check decode row?)")
    check_fields(row, row[WHERE], DECODE_ROW)
    if row["model"] not in PRESETS:  # a row names a preset, never a file to read
        raise InputError(f"{row[WHERE]}: model {row['model']!r}: not a preset ({', '.join(PRESETS)})")
    shape = resolve_shape(row["model"], overrides={"n_layers": row["n_layers"]})
    out = {key: row.get(key) for key in COPIED}
    out.update(model=row["model"], shape=shape.name, model_args=dataclasses.asdict(shape.args))
    out.update(decode_ms_per_token=row["tpot_ms"], tp=row.get("tp", 1), kind="decode")
    out[WHERE] = row[WHERE]
    return out


def read_rows(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(decode rows as ladder-bench rows, ``ceilings`` rows) of a file of ladder-bench or gpu_check rows; a
    gpu_check row of another kind (train, profile, big) or one whose part failed (``error``) is left out."""
    decode, ceilings = [], []
    for row in read_bench(path):
        kind = row.get("kind")
        if kind is None:  # ladder-bench
            missing = [key for key in BENCH_KEYS if row.get(key) is None]
            if missing:
                raise InputError(f"{row[WHERE]}: missing key {missing[0]!r} or null (not a ladder-bench row?)")
            if not isinstance(row.get("model_args"), dict):
                raise InputError(
                    f"{row[WHERE]}: no model_args in the row: rerun ladder-bench with a version that records them"
                )
            decode.append(row)
        elif kind == "decode" and not row.get("error"):
            decode.append(from_decode_row(row))
        elif kind == "ceilings" and not row.get("error"):
            check_fields(row, row[WHERE], CEILINGS_ROW)
            ceilings.append(row)
    return decode, ceilings


def decode_rows(path: str | Path) -> list[dict]:
    """The rows of ``path`` ladder-predict can predict; none is an InputError of one line."""
    rows, _ = read_rows(path)
    if not rows:
        raise InputError(f"{path}: no rows to predict (neither ladder-bench rows nor gpu_check decode rows)")
    return rows


def profile_for(row: dict, devices: dict[str, Device]) -> str:
    """The profile that predicts ``row``: the first whose ``card`` is the row's card (gpu_cards.card_for its
    ``device``); a row measured on the CPU (ladder-bench's ``cpu (N cores)``, or no device named) is ``cpu``'s. A row
    of a card no profile describes is an InputError naming the card and the profiles, never another card's figures."""
    device = str(row.get("device") or "cpu")
    card = card_for(device)
    if card is None and device.casefold().startswith("cpu"):
        return "cpu"
    for name, profile in devices.items():
        if card is not None and profile.card == card.name:
            return name
    what = f"card {card.name} (the row's {device!r})" if card else f"the row's card {device!r}"
    raise InputError(
        f"{row[WHERE]}: no profile has {what} (the profiles: {', '.join(devices)}): give --profile FILE with one "
        "that names it, or predict on another card's with --gpu NAME (--compare)"
    )


def copy_efficiency(ceilings: list[dict], device: Device) -> float | None:
    """The card's measured copy rate over the profile's datasheet bandwidth: the median ``copy_tb_s_median`` of its
    ``ceilings`` rows, or None without one."""
    rates = [row["copy_tb_s_median"] for row in ceilings if row.get("copy_tb_s_median")]
    return statistics.median(rates) * 1e12 / device.mem_bw if rates else None
